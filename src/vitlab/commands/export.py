"""``vitlab export RUN --format hf|onnx|pt2``: a trained model out of vitlab, as the Hub folder timm reads, as ONNX or
as a torch.export program; see docs/interop.md#export."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "export", help="write a run's model as a Hugging Face Hub folder (timm), ONNX or torch.export .pt2",
        description="Write the model of RUN (a `vitlab train` folder, or a Hub folder written by this command). "
                    "hf: config.json in timm's layout, model.safetensors, a model card README.md and manifest.json, "
                    "loaded by timm.create_model('local-dir:DIR', pretrained=True) with vitlab imported, or by "
                    "`vitlab eval --checkpoint DIR`; publish it with huggingface_hub's upload_folder. onnx: "
                    "torch.onnx.export (dynamo) at opset 18, input 'images' with a dynamic batch, output 'logits', "
                    "checked in onnxruntime. pt2: torch.export.save, checked with torch.export.load. Both take "
                    "normalised images at the model's own size; the ONNX/pt2 checks refuse logits more than 1e-4 "
                    "from PyTorch's.")
    p.add_argument("run", metavar="RUN", help="run folder (model.safetensors + config.json) or Hub folder")
    p.add_argument("--format", required=True, choices=("hf", "onnx", "pt2"), help="what to write")
    p.add_argument("--output", default=None, metavar="PATH",
                   help="the folder (hf) or file to write (default: beside RUN, as RUN-hf, RUN.onnx or RUN.pt2)")
    p.add_argument("--force", action="store_true",
                   help="replace an existing output file, or a Hub folder an earlier export wrote (never a run folder "
                        "or a folder of other files)")
    p.add_argument("--license", default=None, metavar="ID",
                   help="hf: the model card's licence, a Hub licence id (default apache-2.0)")
    p.add_argument("--name", default=None, help="hf: the model's name in its card (default: the folder's name)")
    p.add_argument("--no-check", dest="check", action="store_false",
                   help="onnx/pt2: skip running the file against PyTorch")
    p.add_argument("--no-verify", dest="verify", action="store_false",
                   help="load a checkpoint file whose SHA-256 no longer matches its manifest.json (edited on purpose)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from vitlab.errors import ConfigError
    from vitlab.interop.export import export

    hub = {k: v for k, v in (("license", args.license), ("name", args.name)) if v is not None}
    if args.format != "hf" and hub:
        raise ConfigError(f"{', '.join('--' + k for k in hub)} belong(s) to --format hf (the model card); drop them")
    result = export(args.run, args.format, args.output, force=args.force, verify=args.verify, check=args.check,
                    **hub)
    if args.format == "hf":
        print(f"wrote {result}: config.json (timm), model.safetensors, README.md (model card), manifest.json; load it "
              f"with timm.create_model('local-dir:{result}', pretrained=True) after `import vitlab`, publish it with "
              "huggingface_hub.HfApi().upload_folder(repo_id=..., folder_path=...)")
    else:
        print(result.line())
    return 0
