"""The HTTP client of a measurement against a local stand-in for llama-server: the stream parser, the record's
figures, the probability request, the chat template step, and every way the server can misbehave."""

from __future__ import annotations

import dataclasses

import pytest

from harness.hosts.engine import Endpoint
from harness.intake import manifest as mf
from harness.run import client
from harness.run.client import MeasurementFailed
from tests.conftest import DEMO
from tests.fakeserver import FakeLlamaServer

DEMO_M = mf.load(DEMO)
TASK = DEMO_M.task("json-out")


def test_stream_parser_times_tokens_and_reads_the_final_chunk():
    with FakeLlamaServer(tokens=[5, 9, 4, 7, 7], delay_s=0.01) as srv:
        res = client.stream_completion(Endpoint(srv.port), client.request_body(DEMO_M, TASK, "hi", stream=True), 10)
    assert res.tokens == [5, 9, 4, 7, 7] and res.chunks == 5
    assert res.text == "t5 t9 t4 t7 t7 "
    assert res.final["stop"] and res.predicted_n == 5
    # 4 tokens arrive after the first, about 10 ms apart
    assert 0.03 <= res.decode_s <= 0.5 and res.decode_tok_s == pytest.approx(4 / res.decode_s)
    assert res.ttft_s > 0 and res.request_s >= res.ttft_s + res.decode_s


def test_figures_of_a_record_and_absent_draft_counts_are_zero():
    with FakeLlamaServer(timings={"prompt_n": 3, "predicted_n": 5, "predicted_per_second": 400.0}) as srv:
        out = client.run_request(DEMO_M, TASK, Endpoint(srv.port), "hi", with_probs=False)
    assert out["server"]["draft_n"] == 0 and out["server"]["draft_n_accepted"] == 0
    assert out["server"]["predicted_per_second"] == 400.0
    assert out["output"]["n_tokens"] == 5 and len(out["output"]["sha256"]) == 64
    assert "probs" not in out


def test_probability_request_gives_margins():
    with FakeLlamaServer(tokens=[5, 9, 4]) as srv:
        out = client.run_request(DEMO_M, TASK, Endpoint(srv.port), "hi", with_probs=True)
        body = srv.requests[-1][1]
    assert body["n_probs"] == 2 and body["stream"] is False and body["cache_prompt"] is False
    assert [p["margin"] for p in out["probs"]["positions"]] == [0.0, 1.0, 2.0]
    assert out["probs"]["positions"][1]["top2_id"] == 10


def test_chat_endpoint_renders_with_the_models_template_then_streams_completion():
    chat = dataclasses.replace(DEMO_M, endpoint="chat")
    with FakeLlamaServer() as srv:
        out = client.run_request(chat, TASK, Endpoint(srv.port), "Say hi.", with_probs=True)
        paths = [p for p, _ in srv.requests]
        prompts = [b.get("prompt") for p, b in srv.requests if p == "/completion"]
    assert paths == ["/apply-template", "/completion", "/completion"]
    assert all(p.startswith("<start_of_turn>user\nSay hi.") for p in prompts)
    assert out["output"]["tokens"]


@pytest.mark.parametrize("mode, reason", [("http-error", "HTTP 500"), ("no-final", "without a final chunk"),
                                          ("bad-json", "connection to the server failed")])
def test_misbehaving_server_is_a_measurement_failure(mode, reason):
    with FakeLlamaServer(mode=mode) as srv, pytest.raises(MeasurementFailed, match=reason):
        client.stream_completion(Endpoint(srv.port), client.request_body(DEMO_M, TASK, "hi", stream=True), 10)


def test_nothing_listening_is_a_measurement_failure():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(MeasurementFailed, match="connection to the server failed"):
        client.stream_completion(Endpoint(port), client.request_body(DEMO_M, TASK, "hi", stream=True), 5)


def test_concurrent_clients_aggregate():
    with FakeLlamaServer(tokens=list(range(10)), delay_s=0.002) as srv:
        first, agg = client.concurrent(DEMO_M, TASK, Endpoint(srv.port), "hi", 3)
    assert agg["streams"] == 3 and len(agg["per_stream_tok_s"]) == 3 and agg["tokens"] == 3 * 10
    assert agg["aggregate_tok_s"] > 0 and first.predicted_n == 10
