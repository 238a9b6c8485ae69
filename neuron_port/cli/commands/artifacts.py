"""``compile`` and ``generate``: write a verified artifact, and run one from its directory alone."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from neuron_port.cli.commands.common import (
    MODEL_HELP,
    add_dtype_option,
    add_model_source_options,
    add_prompt_options,
    emit_generation,
    int_list,
    print_json,
    prompt_from_args,
    speculation_report,
    text_stream,
)
from neuron_port.cli.quant_flags import add_quant_option


def _cmd_compile(args: argparse.Namespace) -> int:
    from neuron_port.artifacts.writer import write_artifact
    from neuron_port.backends import backend_spec, check_backend_tp, require_backend
    from neuron_port.graph.shapes import PortShape
    from neuron_port.model.layout import describe
    from neuron_port.model.loading import load_source, parse_dtype
    from neuron_port.parallel.ranks import RankSetup

    check_backend_tp(args.backend, args.tp)
    if args.draft_tokens and args.backend != "cpu":
        from neuron_port.errors import NeuronPortError

        raise NeuronPortError(f"--draft-tokens: verify graphs are saved in cpu artifacts for now, found --backend "
                              f"{args.backend}")
    require_backend(args.backend)  # before any model is built: one line naming the Neuron packages
    model, source = load_source(args.model, tiny=args.tiny, seed=args.seed, dtype=parse_dtype(args.dtype), quant=args.quant)
    setup = RankSetup.for_layout(describe(model), args.tp)
    tok_dir = args.model if Path(args.model).is_dir() else None
    if tok_dir is not None and not (Path(tok_dir) / "tokenizer.json").is_file():
        print(f"warning: {tok_dir} has no tokenizer.json: the artifact will generate from token ids only; serve, "
              "--prompt and doctor need one (for a random-weight test directory, "
              "neuron_port.model.localdir.write_tokenizer(DIR, vocab_size) writes a demo tokenizer)", file=sys.stderr)
    manifest = write_artifact(args.out, model, source, setup, PortShape(args.buckets, args.kv_lens,
                                                                        draft_tokens=args.draft_tokens),
                              args.backend, args.batch, tok_dir)
    summary = {**manifest.summary(), "out": str(Path(args.out).resolve())}
    if backend_spec(args.backend).whole_artifact:
        summary.update(_device_bytes(Path(args.out), model, setup, max(args.kv_lens), args.batch))
    if args.json:
        print_json(summary)
    else:
        print(f"artifact written to {summary['out']} ({summary['files']} files, backend {args.backend}, tp {args.tp}): "
              f"prompts up to {max(summary['buckets'])} tokens (buckets {summary['buckets']}, --buckets), context "
              f"{max(summary['kv_lens'])} tokens (KV lengths {summary['kv_lens']}, --kv-lens)")
    return 0


def _draft_tokens(args: argparse.Namespace, manifest) -> int:
    """Drafted tokens per verify step for ``generate --speculate``: ``--draft-tokens``, or all the artifact's verify
    graphs take; 0 without ``--speculate``. What the artifact cannot do is refused in one line."""
    from neuron_port.errors import ArtifactError

    compiled = manifest.shape.draft_tokens
    if not args.speculate:
        return 0
    if args.check:
        raise ArtifactError("--check compares every step's logits, which verify steps do not keep yet: check the "
                            "artifact without --speculate (speculation keeps greedy output)")
    wanted = compiled if args.draft_tokens is None else args.draft_tokens
    if not 1 <= wanted <= compiled:
        raise ArtifactError(f"--speculate needs verify graphs for up to {wanted or 1} drafts; the artifact {args.dir} "
                            f"has them for {compiled}: compile it with --draft-tokens K")
    return wanted


def _device_bytes(out: Path, model, setup, kv_len: int, batch: int) -> dict:
    """What each NeuronCore's shard holds against the planner's per-core weights (device tensors only),
    and the one KV store every graph aliases against the planner's per-core KV at the largest length."""
    from neuron_port.backends.nxd_artifact import kv_state_bytes, shard_bytes
    from neuron_port.graph.kv import kv_store_spec
    from neuron_port.model.quant import quant_of
    from neuron_port.parallel.per_core import core_params, rank0_kv_heads

    shards = shard_bytes(out / "rank0")
    itemsize = next(p for p in model.parameters() if p.is_floating_point()).element_size()
    planned = core_params(setup.layout, model.config, setup.tp).weight_bytes(itemsize, quant_of(model))
    kv_plan = kv_store_spec(setup.layout, kv_len, kv_heads=rank0_kv_heads(setup.layout, setup.tp)).total_bytes(batch, itemsize)
    return {"shard_bytes_per_core": shards, "plan_weight_bytes_per_core": planned,
            "shard_to_plan": round(max(shards) / planned, 4),
            "kv_state_bytes_per_core": kv_state_bytes(out / "rank0"), "plan_kv_bytes_per_core": kv_plan}


def _cmd_generate(args: argparse.Namespace) -> int:
    from neuron_port.artifacts.manifest import verify
    from neuron_port.checks.checked_run import CheckedRun
    from neuron_port.checks.reference import reference_model
    from neuron_port.checks.validation import artifact_run_report, artifact_self_checks, compare_with_reference
    from neuron_port.errors import ArtifactError
    from neuron_port.generation.generate import generate
    from neuron_port.generation.opened import OpenedModel
    from neuron_port.generation.request import GenerationRequest
    from neuron_port.model.loading import parse_dtype
    from neuron_port.model.quant import scheme_flags

    manifest = verify(args.dir, args.allow_version_mismatch)
    if args.dtype is not None and parse_dtype(args.dtype) != manifest.dtype:
        raise ArtifactError(f"--dtype {args.dtype}: the artifact {args.dir} was compiled in {manifest.dtype}; "
                            f"compile it again with --dtype {args.dtype}, or drop --dtype")
    compiled_quant = manifest.source.quant
    if args.quant is not None and args.quant != compiled_quant:
        asked, compiled = scheme_flags(args.quant), scheme_flags(compiled_quant)
        raise ArtifactError(f"{asked}: the artifact {args.dir} was compiled with {compiled}; compile it again with "
                            f"{asked}, or drop --quant")
    opened = OpenedModel.open(args.dir)
    prompt = prompt_from_args(args, opened)
    texts = args.prompt is not None or args.chat is not None
    stop_ids = opened.stop_ids(args.chat is not None, eos_means_end=texts, stop_at_eos=args.stop_at_eos)
    draft_tokens = _draft_tokens(args, manifest)
    request = GenerationRequest.greedy([prompt], args.max_new_tokens, stop_ids, keep_logits=args.check,
                                       draft_tokens=draft_tokens)
    stream = text_stream(args, opened)  # the answer as it comes, for a person reading a text prompt's
    result = generate(args.dir, request, manifest=manifest, tokenizer=stream.tokenizer if stream else None, on_token=stream)
    if args.check:
        reference = reference_model(manifest)
        checked = artifact_self_checks(args.dir, manifest, reference, prompt, result)
        checked.match = compare_with_reference(result.tokens[0], reference, prompt, args.max_new_tokens, stop_ids)
    else:
        checked = CheckedRun(run=artifact_run_report(args.dir, manifest, prompt, result))
    checked.run["dtype"] = str(manifest.dtype)
    if draft_tokens:
        checked.run["speculation"] = speculation_report(args.speculate, draft_tokens, result)
    if texts:
        checked.run["text"] = opened.decode(result.tokens[0], stop_ids)
    return emit_generation(checked, args, stream)


def add(sub) -> None:
    p = sub.add_parser("compile", help="compile the two graphs into a verified artifact directory")
    p.add_argument("model", help=MODEL_HELP)
    p.add_argument("--tiny", action="store_true", help="random weights on the tiny variant of a config")
    add_model_source_options(p, weights=True)
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (NeuronCores; gloo ranks on cpu)")
    p.add_argument("--backend", default="cpu", choices=["cpu", "neuron", "nxd"],
                   help="cpu (TorchScript), neuron (one NeuronCore: neuronx-distributed's ModelBuilder at tp 1) or nxd "
                        "(the same ModelBuilder at any tp), the last two on an Inferentia2 host; xla graphs are checked "
                        "in process by 'port --backend xla', not saved")
    p.add_argument("--out", required=True, help="artifact directory (written atomically)")
    p.add_argument("--seed", type=int, default=0, help="seed of random weights (--tiny, --random-weights)")
    p.add_argument("--buckets", type=int_list, default=[32, 64, 128], help="prompt buckets: the longest is the longest "
                   "prompt the artifact takes")
    p.add_argument("--kv-lens", type=int_list, default=[256], help="KV lengths, e.g. 512,4096: the longest is the "
                   "context (prompt + new tokens); a decode runs on the shortest that holds it")
    p.add_argument("--batch", type=int, default=1, help="batch size the graphs are compiled for")
    p.add_argument("--draft-tokens", type=int, default=0, metavar="K",
                   help="speculative decoding: also compile verify graphs for up to K drafted tokens per step (cpu "
                        "backend; generate --speculate uses them; default 0: none)")
    add_dtype_option(p, "of the graphs, weights, host embeddings and KV store")
    add_quant_option(p)
    p.add_argument("--json", action="store_true", help="print JSON (for scripts) instead of lines for people")
    p.set_defaults(func=_cmd_compile)

    p = sub.add_parser("generate", help="run a compiled artifact from its directory alone (fresh process)")
    p.add_argument("dir", help="an artifact directory (compile --out)")
    add_prompt_options(p, default_tokens=32)
    p.add_argument("--seed", type=int, default=0, help="seed of the random prompt")
    eos = p.add_mutually_exclusive_group()
    eos.add_argument("--stop-at-eos", dest="stop_at_eos", action="store_true", default=None,
                     help="stop at the end-of-sequence ids (config, generation_config.json; with --chat the turn's "
                          "end): the default for --prompt and --chat")
    eos.add_argument("--ignore-eos", dest="stop_at_eos", action="store_false",
                     help="never stop at end-of-sequence (the default for --prompt-len random prompts)")
    p.add_argument("--dtype", default=None, choices=["fp32", "bf16"],
                   help="the dtype the artifact must have been compiled in (an artifact keeps its own; default: any)")
    add_quant_option(p, default=None, what="the weight scheme the artifact must have been compiled with (it keeps its own; "
                     "default: any)")
    p.add_argument("--check", action="store_true", help="compare with HF generate on the artifact's own checkpoint and run the "
                   "self-checks an artifact allows (host embedding files, every step's logits)")
    p.add_argument("--allow-version-mismatch", action="store_true",
                   help="run even if the installed torch / Neuron versions differ from the artifact's")
    p.add_argument("--speculate", choices=["ngram"], default=None,
                   help="speculative decoding by prompt lookup on the artifact's verify graphs (compile --draft-tokens); "
                        "greedy output is unchanged")
    p.add_argument("--draft-tokens", type=int, default=None, metavar="K",
                   help="--speculate: drafted tokens checked per verify step at most (default: all the artifact's "
                        "verify graphs take)")
    p.add_argument("--json", action="store_true", help="print JSON (for scripts) instead of lines for people")
    p.set_defaults(func=_cmd_generate)


__all__ = ["add"]
