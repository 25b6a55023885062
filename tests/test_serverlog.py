"""Reading llama-server logs: the failure line and the server's own speculative statistics, on real log
excerpts captured from b11434 runs of the generated drafters (tests/data/serverlogs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.run import serverlog

LOGS = Path(__file__).parent / "data" / "serverlogs"


def _parse(name: str) -> serverlog.ServerLog:
    return serverlog.parse((LOGS / f"{name}.log").read_bytes())


@pytest.mark.parametrize("name, failure", [
    ("fail-no-conv-keys", "error loading model: DFlash2 model is missing conv/selector metadata"),
    ("fail-no-target-layers", "error loading model: error loading model hyperparameters: DFlash model requires "
                              "'target_layers' in GGUF metadata"),
    ("fail-extra-tensor", "error loading model: done_getting_tensors: wrong number of tensors; expected 37, got 36"),
    ("fail-group96", "error loading model: DFlash2 hidden size must be divisible by conv_group_size"),
    ("fail-eagle3-two", "error loading model: error loading model hyperparameters: EAGLE3 requires exactly 3 "
                        "entries in 'extract_layers'"),
    ("fail-embed128", "ggml.c:3354: GGML_ASSERT(ggml_can_mul_mat(a, b)) failed"),
    ("fail-layer7", "llama-context.cpp:1242: GGML_ASSERT(lid <= model.hparams.n_layer()) failed"),
    ("fail-llama-under-dflash", 'speculative.cpp:1033: GGML_ASSERT(target_layer_ids_n > 0 && "DFlash model has '
                                'no target_layer_ids") failed'),
    ("fail-no-mask", "common.cpp:2225: get_sub_batch: failed to add embedding at index 1 (error -2, n = 4)"),
    ("fail-mtp-on-llama", "context type MTP requested but model doesn't contain MTP layers"),
    ("fail-dflash2-kernel16", "ggml.c:1814: GGML_ASSERT(obj_new) failed"),
])
def test_failure_line_is_the_cause(name, failure):
    got = _parse(name)
    assert got.failure == failure
    assert got.draft_acceptance is None and got.requests == 0


@pytest.mark.parametrize("name", ["fail-dflash2-kernel16", "fail-dflash2-kernel16-late-warning"])
def test_assertion_carries_the_warning_beside_it(name):
    # the logger thread prints the warning before or after the assertion's own line: both orders were seen
    got = _parse(name)
    assert got.failure == "ggml.c:1814: GGML_ASSERT(obj_new) failed"
    assert got.failure_detail == ("ggml_new_object: not enough space in the context's memory pool "
                                     "(needed 418624, available 418256)")


def test_harmless_dflash_error_line_is_not_a_failure():
    # every DFlash/EAGLE3 start logs "dflash requires ctx_other to be set" while fitting memory
    for name in ("ok-draft-dflash", "ok-draft-dspark", "ok-draft-eagle3", "silent-dspark-under-dflash"):
        text = (LOGS / f"{name}.log").read_text()
        assert "requires ctx_other to be set" in text
        assert serverlog.parse(text).failure is None


@pytest.mark.parametrize("name, spec, accepted, generated, mean_len", [
    ("ok-draft-dflash", "draft-dflash", 31, 94, 1.97),
    ("ok-draft-dspark", "draft-dspark", 39, 70, 2.62),
    ("ok-draft-eagle3", "draft-eagle3", 46, 51, 3.71),
    ("ok-draft-mtp", "draft-mtp", 38, 70, 2.58),
    ("ok-draft-simple", "draft-simple", 47, 48, 3.94),
    ("ok-ngram-cache", "ngram-cache", 0, 8, 1.00),
])
def test_acceptance_at_default_verbosity(name, spec, accepted, generated, mean_len):
    got = _parse(name)
    assert got.failure is None and got.requests == 1
    assert got.draft_acceptance == {"rate": pytest.approx(accepted / generated, abs=1e-5), "accepted": accepted,
                                       "generated": generated, "mean_len": mean_len}
    assert got.statistics == {}  # the per-implementation counters need -lv 4
    assert got.timings["eval_tokens"] == 64 and got.timings["prompt_tokens"] > 0


@pytest.mark.parametrize("name, spec, acc_tokens, per_pos", [
    ("ok-draft-dflash-lv4", "draft-dflash", 31, [0.969, 0.0, 0.0]),
    ("ok-draft-dspark-lv4", "draft-dspark", 39, None),
    ("ok-draft-mtp-lv4", "draft-mtp", 38, None),
    ("ok-ngram-map-k-lv4", "ngram-map-k", 0, None),
])
def test_trace_statistics_per_implementation(name, spec, acc_tokens, per_pos):
    got = _parse(name)
    stats = got.statistics[spec]
    assert stats["acc_tokens"] == acc_tokens
    assert got.implementations == [spec]
    if got.draft_acceptance:
        # the server's line and the implementation's counters agree
        assert got.draft_acceptance["accepted"] == stats["acc_tokens"]
        assert got.draft_acceptance["generated"] == stats["gen_tokens"]
        assert stats["mean_acc_len"] == got.draft_acceptance["mean_len"]
        assert len(got.acc_per_pos) == 3
    if per_pos:
        assert got.acc_per_pos == per_pos


def test_what_each_type_reports_about_itself():
    dflash = _parse("ok-draft-dflash").params
    assert dflash == {"n_max": 3, "n_min": 0, "p_min": 0.0, "block_size": 4, "mask_token_id": 0, "n_extract": 1,
                      "sample_from_anchor": "true"}
    assert _parse("silent-dspark-under-dflash").implementations == ["draft-dflash"]
    assert _parse("fail-no-mask").params["mask_token_id"] == -1


def test_several_requests_report_the_last():
    one = (LOGS / "ok-draft-mtp.log").read_text()
    two = one + one.replace("(   38 accepted /    70 generated)", "(    5 accepted /    9 generated)")
    got = serverlog.parse(two)
    assert got.requests == 2 and got.draft_acceptance["accepted"] == 5


def test_empty_and_garbage_logs():
    assert serverlog.parse("").failure is None
    assert serverlog.parse(b"\xff\xfe binary \x00 junk\n").failure is None
