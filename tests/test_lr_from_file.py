"""``vitlab depth-study --lr-from FILE`` with a hostile or careless ``sensitivity.csv``: each refusal is one line naming
``--lr-from FILE`` and the line, exit 2, before the study folder (or any run folder) exists; and the other JSON files
a command reads from a folder the user names (a checkpoint's ``config.json`` and ``manifest.json``, a Hub folder's
``config.json``, a run's ``metrics.jsonl``) refuse or skip the same shapes of damage in one line."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from _helpers import cli_error
from vitlab.errors import CheckpointError, ConfigError
from vitlab.experiments.rates import best_rates

COLUMNS = ["variant", "depth", "lrs", "runs", "best_lr", "best_val_loss", "best_val_acc", "test_acc_at_best_lr",
           "lr_sensitivity", "divergence_rate", "max_logit"]


def _row(variant: str = "vit", depth: object = 1, lr: object = 1e-3, sens: object = "0.1") -> list[str]:
    values = {"variant": variant, "depth": depth, "lrs": 2, "runs": 2, "best_lr": lr, "best_val_loss": 0.5,
              "best_val_acc": 0.9, "test_acc_at_best_lr": 0.9, "lr_sensitivity": sens, "divergence_rate": 0.0,
              "max_logit": 3.0}
    return [str(values[c]) for c in COLUMNS]


def _write(path: Path, rows: list[list[str]], header: list[str] = COLUMNS) -> Path:
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        w.writerows(rows)
    return path


def _argv(tmp_path: Path, lr_from: Path) -> list[str]:
    return ["depth-study", "--depths", "1", "--variants", "vit,layerscale", "--epochs", "1", "--batch-size", "16",
            "--limit-train", "32", "--limit-test", "16", "--num-images", "4", "--probe-images", "0",
            "--set", "embed_dim=16", "--set", "num_heads=2", "--no-progress", "--output", str(tmp_path / "d"),
            "--lr-from", str(lr_from)]


def _refused(tmp_path: Path, capsys: pytest.CaptureFixture, file: Path) -> str:
    """The CLI's one line for ``file`` (exit 2), after checking that no study folder was created."""
    msg = cli_error(capsys, _argv(tmp_path, file))
    assert not (tmp_path / "d").exists(), "the study folder was created before the file was checked"
    assert f"--lr-from {file}" in msg, msg
    return msg


@pytest.mark.parametrize("lr", ["1e30", "-1", "0", "nan", "inf", "fast"])
def test_a_rate_no_run_can_train_at_is_refused_naming_the_file_and_line(tmp_path, capsys, lr):
    file = _write(tmp_path / "sensitivity.csv", [_row("vit", 1, 1e-3), _row("layerscale", 1, lr)])
    msg = _refused(tmp_path, capsys, file)
    assert "line 3" in msg and "best_lr" in msg and "(0, 10]" in msg, msg
    assert "fix --lr" not in msg  # the flag the user did not pass
    with pytest.raises(ConfigError, match="line 3"):
        best_rates(file)


def test_a_field_over_the_csv_limit_is_one_line(tmp_path, capsys):
    file = _write(tmp_path / "sensitivity.csv", [_row(), _row("layerscale", 1, 1e-3, "0." + "1" * 200_000)])
    msg = _refused(tmp_path, capsys, file)
    assert "line 3" in msg and "131,072 characters" in msg, msg


def test_bytes_that_are_not_utf8_name_the_file_and_line(tmp_path, capsys):
    file = _write(tmp_path / "sensitivity.csv", [_row(), _row("layerscale")])
    file.write_bytes(file.read_bytes().replace(b"layerscale", b"layer\xffscale"))
    msg = _refused(tmp_path, capsys, file)
    assert "line 3" in msg and "0xff is not UTF-8" in msg, msg


def test_a_file_over_the_size_limit_is_refused_unread(tmp_path, capsys):
    file = tmp_path / "sensitivity.csv"
    with file.open("wb") as fh:  # sparse: 17 MiB of NUL bytes that take no disk
        fh.truncate(17 << 20)
    msg = _refused(tmp_path, capsys, file)
    assert "17,825,792 bytes" in msg and "16,777,216" in msg, msg


def test_duplicate_rows_are_refused_naming_both_lines(tmp_path, capsys):
    file = _write(tmp_path / "sensitivity.csv", [_row("vit", 1, 1e-3), _row("layerscale", 1, 2e-3),
                                                 _row("vit", 1, 5e-3)])
    msg = _refused(tmp_path, capsys, file)
    assert "lines 2 and 4 both give vit at depth 1" in msg, msg


@pytest.mark.parametrize("rows, needle", [
    ([_row(), _row("layerscale")[:5]], "line 3: 5 fields where the header has 11"),
    ([_row(), _row("layerscale") + ["extra"]], "line 3: 12 fields where the header has 11"),
    ([_row(), _row("layerscale", 0)], "line 3: depth '0' is not a positive whole number"),
    ([_row(), _row("layerscale", "two")], "line 3: depth 'two' is not a positive whole number"),
    ([_row(), _row("")], "line 3: the variant is empty"),
    ([_row(), _row("layerscale", 1, 1e-3, "steep")], "line 3: lr_sensitivity 'steep' is not a number"),
    ([_row(), _row("layerscale", 1, 1e-3, "")], "line 3: layerscale at depth 1 has not finished"),
], ids=["short-row", "long-row", "depth-0", "depth-text", "no-variant", "sensitivity-text", "unfinished"])
def test_malformed_rows_name_their_line(tmp_path, capsys, rows, needle):
    msg = _refused(tmp_path, capsys, _write(tmp_path / "sensitivity.csv", rows))
    assert needle in msg, msg


@pytest.mark.parametrize("content, needle", [
    ("", "is empty"),
    ("variant,depth,best_lr\nvit,1,0.001\n", "line 1: the header has no column 'lr_sensitivity'"),
    ("variant,depth,depth,best_lr,lr_sensitivity\nvit,1,1,0.001,0.1\n", "line 1: the header repeats column 'depth'"),
    ('variant,depth,best_lr,lr_sensitivity\n"vit,1,0.001,0.1\n', "line 2: unexpected end of data"),
], ids=["empty", "missing-column", "repeated-column", "open-quote"])
def test_a_file_that_is_not_the_table_is_one_line(tmp_path, capsys, content, needle):
    file = tmp_path / "sensitivity.csv"
    file.write_text(content)
    msg = _refused(tmp_path, capsys, file)
    assert needle in msg, msg


def test_a_good_file_still_reads_with_blank_lines_and_a_byte_order_mark(tmp_path):
    file = _write(tmp_path / "sensitivity.csv", [_row("vit", 1, 1e-3), [], _row("layerscale", 2, 3e-3)])
    file.write_bytes(b"\xef\xbb\xbf" + file.read_bytes())  # as a spreadsheet saves it
    assert best_rates(tmp_path) == {("vit", 1): 1e-3, ("layerscale", 2): 3e-3}


# ---------------------------------------------------------------- the checkpoint's JSON files, read the same way

def _checkpoint(tmp_path: Path) -> Path:
    import vitlab
    from vitlab.checkpoint import save_checkpoint

    return save_checkpoint(tmp_path / "ckpt", vitlab.create_model("vit_mnist", depth=1, embed_dim=16, num_heads=2))


@pytest.mark.parametrize("name", ["config.json", "manifest.json"])
@pytest.mark.parametrize("damage, needle", [
    (lambda p: p.write_text("[" * 5000), "nested more deeply than Python can read"),
    (lambda p: p.write_bytes(b'{"format": "\xff"}'), "line 1: byte 0xff is not UTF-8"),
    (lambda p: p.open("ab").truncate(17 << 20), "more than the 16,777,216 bytes"),
], ids=["nested", "binary", "huge"])
def test_damaged_checkpoint_json_is_one_line(tmp_path, capsys, name, damage, needle):
    from vitlab.checkpoint import load_model

    ckpt = _checkpoint(tmp_path)
    damage(ckpt / name)
    with pytest.raises(CheckpointError) as exc:
        load_model(ckpt, verify=name != "config.json")  # an edited config.json is refused by the manifest first
    msg = str(exc.value)
    assert "\n" not in msg and str(ckpt / name) in msg and needle in msg, msg
    msg = cli_error(capsys, ["convert", str(ckpt), str(tmp_path / "out.safetensors"), "--no-verify"]
                    if name == "config.json" else ["convert", str(ckpt), str(tmp_path / "out.safetensors")])
    assert str(ckpt / name) in msg and needle in msg, msg
    assert not (tmp_path / "out.safetensors").exists()


def test_the_json_reader_keeps_good_files(tmp_path):
    from vitlab.checkpoint.textfiles import read_json

    (tmp_path / "a.json").write_text(json.dumps({"a": [1, 2, {"b": None}]}))
    assert read_json(tmp_path / "a.json", fix="re-save it", error=CheckpointError) == {"a": [1, 2, {"b": None}]}


def test_a_hub_folders_config_json_is_read_within_the_limit(tmp_path):
    from vitlab.interop.hub import read_hub_config

    (tmp_path / "config.json").open("wb").truncate(17 << 20)  # sparse: not read, refused by its size
    with pytest.raises(CheckpointError) as exc:
        read_hub_config(tmp_path, verify=False)
    assert str(tmp_path / "config.json") in str(exc.value) and "more than the 16,777,216 bytes" in str(exc.value)


def test_json_lines_nested_too_deeply_are_skipped_like_torn_ones(tmp_path):
    """A run folder's metrics.jsonl and tracker state, read back on --resume and by the studies."""
    from vitlab.train import tracking
    from vitlab.train.logging import read_metrics

    (tmp_path / "metrics.jsonl").write_text('{"epoch": 1}\n' + "[" * 5000 + "\n" + '{"epoch": 2}\n')
    assert read_metrics(tmp_path) == [{"epoch": 1}, {"epoch": 2}]
    (tmp_path / tracking.STATE).write_text("[" * 5000)
    assert tracking._previous_run_id(tmp_path, "mlflow") is None


@pytest.mark.parametrize("damage", [b"[" * 5000, b'{"threshold": 0.5, "num_images": 4\xff}', b"[0.5, 4]"],
                         ids=["nested", "binary", "a-list"])
def test_a_damaged_diagnostics_json_is_computed_again(tmp_path, damage):
    """A depth study's per-run diagnostics.json, read back when the study runs again."""
    import torch

    import vitlab
    from vitlab.analysis.depth_diagnostics import diagnose
    from vitlab.checkpoint import save_checkpoint

    save_checkpoint(tmp_path, vitlab.create_model("vit_mnist", depth=1, embed_dim=16, num_heads=2))
    (tmp_path / "diagnostics.json").write_bytes(damage)
    images = torch.randint(0, 256, (4, 1, 28, 28), dtype=torch.uint8)
    diag = diagnose(tmp_path, images, None, [], (0.1307,), (0.3081,), threshold=0.5)
    kept = json.loads((tmp_path / "diagnostics.json").read_text())  # written again, whole
    assert diag["num_images"] == kept["num_images"] == 4 and kept["threshold"] == 0.5 and kept.keys() == diag.keys()


def _verdict_runs(tmp_path: Path) -> tuple[Path, Path]:
    arms = []
    for arm, accs in (("a", (0.90, 0.92, 0.91)), ("b", (0.85, 0.88, 0.86))):
        for seed, acc in enumerate(accs):
            run = tmp_path / arm / f"run_seed={seed}"
            run.mkdir(parents=True)
            (run / "summary.json").write_text(json.dumps({"final_test_acc": acc}))
            (run / "config.json").write_text(json.dumps({"model": {"num_classes": 10}, "run": {"seed": seed}}))
            (run / "metrics.jsonl").write_text(json.dumps({"epoch": 1, "probe/max_logit/0": 10.0 + seed}) + "\n")
        arms.append(tmp_path / arm)
    return arms[0], arms[1]


@pytest.mark.parametrize("name, damage, needle", [
    ("summary.json", b"[" * 5000, "summary.json is not valid JSON for vitlab (nested more deeply"),
    ("summary.json", b'{"final_test_acc": 0.9\xff}', "summary.json line 1: byte 0xff is not UTF-8"),
    ("summary.json", b"[0.9]", "summary.json is a JSON list, not an object"),
    ("config.json", b"[" * 5000, "config.json is not valid JSON for vitlab (nested more deeply"),
], ids=["summary-nested", "summary-binary", "summary-list", "config-nested"])
def test_vitlab_verdict_names_the_run_and_file_of_damaged_json(tmp_path, capsys, name, damage, needle):
    a, b = _verdict_runs(tmp_path)
    (b / "run_seed=1" / name).write_bytes(damage)
    msg = cli_error(capsys, ["verdict", str(a), str(b)])
    assert f"run {b / 'run_seed=1'}: {needle}" in msg, msg


def test_vitlab_verdict_skips_a_metrics_line_nested_too_deeply(tmp_path, capsys):
    from vitlab.cli import main

    a, b = _verdict_runs(tmp_path)
    with (b / "run_seed=1" / "metrics.jsonl").open("a") as fh:
        fh.write("[" * 5000 + "\n")
    assert main(["verdict", str(a), str(b), "--metric", "max_logit"]) == 0, capsys.readouterr().err
