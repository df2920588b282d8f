"""A study reads a finished run back only when the run is as long as this invocation would train it: `--epochs`
left to the budget or the recipe is resolved first (the recipe's 50 epochs on mnist-5k), so a 1-epoch run is not
read back as the answer to a 50-epoch request; the study refuses in one line naming the fix."""

from __future__ import annotations

from _helpers import cli_error

ARGS = ["depth-study", "--depths", "1", "--variants", "vit", "--limit-train", "32", "--limit-test", "16",
        "--batch-size", "16", "--num-images", "4", "--probe-images", "0", "--set", "embed_dim=16", "--set",
        "num_heads=2", "--no-progress"]


def test_a_run_of_another_length_is_not_read_back_when_epochs_is_left_to_the_recipe(tmp_path, capsys):
    from vitlab.cli import main

    out = ["--output", str(tmp_path / "d")]
    assert main([*ARGS, "--epochs", "1", *out]) == 0
    capsys.readouterr()
    assert main([*ARGS, "--epochs", "1", "--dry-run", *out]) == 0  # the same length: read back
    assert "vit_depth1_seed0: finished, read back" in capsys.readouterr().out
    msg = cli_error(capsys, [*ARGS, "--dry-run", *out])  # the recipe's epochs
    assert "finished with other settings (epochs 1 there, 50 now)" in msg and "pass another --output" in msg, msg
