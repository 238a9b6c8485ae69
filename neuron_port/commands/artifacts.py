"""``compile`` and ``generate``: write a verified artifact, and run one from its directory alone."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from neuron_port.commands.common import add_prompt_options, emit_generation, int_list, print_json, prompt_ids


def _cmd_compile(args: argparse.Namespace) -> int:
    from neuron_port.artifact_writer import write_artifact
    from neuron_port.backends import require_backend
    from neuron_port.layout import describe
    from neuron_port.models import load_source
    from neuron_port.ranks import RankSetup
    from neuron_port.shapes import PortShape

    if args.backend == "neuron":
        require_backend(args.backend)
    model, source = load_source(args.model, tiny=args.tiny, seed=args.seed)
    setup = RankSetup.for_layout(describe(model), args.tp)
    tok_dir = args.model if Path(args.model).is_dir() else None
    if tok_dir is not None and not (Path(tok_dir) / "tokenizer.json").is_file():
        print(f"warning: {tok_dir} has no tokenizer.json: the artifact will generate from token ids only; serve, "
              "--prompt and doctor need one (for a random-weight test directory, "
              "neuron_port.localdir.write_tokenizer(DIR, vocab_size) writes a demo tokenizer)", file=sys.stderr)
    manifest = write_artifact(args.out, model, source, setup, PortShape(args.buckets, args.kv_lens), args.backend,
                              args.batch, tok_dir)
    summary = {k: manifest[k] for k in ("backend", "tp", "buckets", "kv_lens", "batch", "weights_fingerprint")}
    summary["out"] = str(Path(args.out).resolve())
    summary["files"] = len(manifest["files"])
    if args.json:
        print_json(summary)
    else:
        print(f"artifact written to {summary['out']} ({summary['files']} files, backend {args.backend}, tp {args.tp})")
    return 0


def _cmd_generate(args: argparse.Namespace) -> int:
    from neuron_port.artifact import verify
    from neuron_port.artifact_reader import reference_model
    from neuron_port.configs import load_config
    from neuron_port.families import family_for
    from neuron_port.validation import artifact_self_checks, compare_with_reference, run_artifact

    manifest = verify(args.dir, args.allow_version_mismatch)
    config = load_config(Path(args.dir) / "config.json")
    family = family_for(config.model_type)
    special = family.special_ids(config)
    prompt = prompt_ids(args, args.dir, family.vocab_size(config), special.bos)
    stop_ids = list(special.eos) if args.stop_at_eos else []
    out = run_artifact(args.dir, prompt, args.max_new_tokens, stop_ids, manifest, keep_logits=args.check)
    if args.check:
        reference = reference_model(manifest)
        out = artifact_self_checks(args.dir, manifest, reference, prompt, out)
        out = compare_with_reference(out, reference, prompt, args.max_new_tokens, stop_ids)
    return emit_generation(out, args)


def add(sub) -> None:
    p = sub.add_parser("compile", help="compile the two graphs into a verified artifact directory")
    p.add_argument("model")
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--backend", default="cpu", choices=["cpu", "neuron"],
                   help="cpu (TorchScript) or neuron (torch-neuronx, on an Inferentia2 host); xla graphs are checked "
                        "in process by 'port --backend xla', not saved")
    p.add_argument("--out", required=True, help="artifact directory (written atomically)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--buckets", type=int_list, default=[32, 64, 128])
    p.add_argument("--kv-lens", type=int_list, default=[256], help="KV lengths, e.g. 128,256")
    p.add_argument("--batch", type=int, default=1, help="batch size the graphs are compiled for")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_compile)

    p = sub.add_parser("generate", help="run a compiled artifact from its directory alone (fresh process)")
    p.add_argument("dir")
    add_prompt_options(p, default_tokens=32)
    p.add_argument("--seed", type=int, default=0, help="seed of the random prompt")
    p.add_argument("--stop-at-eos", action="store_true")
    p.add_argument("--check", action="store_true", help="compare with HF generate on the artifact's own checkpoint and run the "
                   "self-checks an artifact allows (host embedding files, every step's logits)")
    p.add_argument("--allow-version-mismatch", action="store_true",
                   help="run even if the installed torch / Neuron versions differ from the artifact's")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_generate)


__all__ = ["add"]
