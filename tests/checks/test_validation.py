"""Checking an artifact in process: its tokens and every step's logits against Hugging Face on the
checkpoint it was built from; the comparison says where a wrong run diverges."""

from neuron_port.artifacts.manifest import verify
from neuron_port.checks.reference import reference_model
from neuron_port.checks.validation import artifact_prompt, check_artifact, compare_with_reference


def test_the_tiny_artifact_passes_its_checks(tiny_e2b_artifact):
    prompt = artifact_prompt(tiny_e2b_artifact, 12, seed=3)
    assert prompt == artifact_prompt(tiny_e2b_artifact, 12, seed=3) and prompt[0] == 2  # seeded, BOS first
    checked = check_artifact(tiny_e2b_artifact, max_new_tokens=8, prompt=prompt)
    assert checked.passed and checked.seq_match and checked.self_checks_passed
    assert checked.run["tokens"] == checked.match.reference_tokens and len(checked.run["tokens"]) == 8
    out = checked.to_json()
    assert out["seq_match"] and out["self_checks_passed"] and out["tokens"] == out["reference_tokens"]
    assert out["backend"] == "cpu" and out["prompt_tokens"] == 12 and "step_logits" not in out


def test_a_wrong_run_is_caught_where_it_diverges(tiny_e2b_artifact):
    prompt = artifact_prompt(tiny_e2b_artifact, 12)
    reference = reference_model(verify(tiny_e2b_artifact))
    right = compare_with_reference([], reference, prompt, 6).reference_tokens
    assert compare_with_reference(right, reference, prompt, 6).seq_match
    wrong = right[:3] + [(right[3] + 1) % 512] + right[4:]
    match = compare_with_reference(wrong, reference, prompt, 6)
    assert not match.seq_match and match.divergence.index == 3 and match.divergence.port_token == wrong[3]
    assert match.to_json()["divergence"]["index"] == 3 and match.to_json()["seq_match"] is False
