"""The server's own speculative counters (harness/run/metrics.py): the Prometheus text of llama-server b11434, a
scrape that cannot be read is a recorded absence, the protocol reads them around the timed request, and acceptance
by position comes from them where a record has them."""

from __future__ import annotations

import pytest

from harness.analysis import acceptance as acc
from harness.analysis.records import CellIndex
from harness.analysis.summary import summarize
from harness.hosts.engine import Endpoint
from harness.run import metrics
from harness.store.rundir import RunDir
from tests.fake_engine import fake, records, run_demo
from tests.fakeserver import FakeLlamaServer

#: What b11434 serves after one request (tools/server/server-task.cpp), other families around the speculative ones.
B11434 = """# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 1625
# TYPE llamacpp:spec_decode_num_draft_tokens_total counter
llamacpp:spec_decode_num_draft_tokens_total 117
# TYPE llamacpp:spec_decode_num_accepted_tokens_total counter
llamacpp:spec_decode_num_accepted_tokens_total 112
# TYPE llamacpp:spec_decode_num_drafts_total counter
llamacpp:spec_decode_num_drafts_total 15
# TYPE llamacpp:predicted_tokens_seconds gauge
llamacpp:predicted_tokens_seconds 1233.38
# TYPE llamacpp:spec_decode_num_accepted_tokens_per_pos_total counter
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 15
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="1"} 15
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="2"} 14
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="3"} 14
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="4"} 14
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="5"} 14
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="6"} 13
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="7"} 13
"""


def test_the_pinned_builds_text_parses_and_a_fresh_servers_difference_is_the_request():
    after = metrics.parse(B11434)
    assert (after.drafts, after.draft_tokens, after.accepted) == (15, 117, 112)
    c = metrics.difference(metrics.parse(""), after)  # a fresh server's first scrape has no spec families yet
    assert c == {"drafts": 15, "draft_tokens": 117, "accepted": 112,
                 "accepted_per_pos": [15, 15, 14, 14, 14, 14, 13, 13]}
    assert metrics.mean_length(c) == pytest.approx(1 + 112 / 15)
    # the build prints totals through a double stream: past six digits in exponent form
    big = metrics.parse("llamacpp:spec_decode_num_drafts_total 1.5e+06\n")
    assert big.drafts == 1_500_000


@pytest.mark.parametrize("text, why", [
    ("llamacpp:spec_decode_num_drafts_total banana\n", "not a number"),
    ("llamacpp:spec_decode_num_drafts_total -3\n", "not a count"),
    ("llamacpp:spec_decode_num_drafts_total 1.25\n", "not a count"),
    ("llamacpp:spec_decode_num_drafts_total inf\n", "not a count"),
    ("llamacpp:spec_decode_num_drafts_total 1\nllamacpp:spec_decode_num_drafts_total 2\n", "given twice"),
    ('llamacpp:spec_decode_num_accepted_tokens_per_pos_total{slot="0"} 3\n', "without a position"),
    ('llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="99999"} 3\n', "beyond"),
    ("llamacpp:spec_decode_num_drafts_total{\n", "not a Prometheus sample"),
])
def test_garbage_in_the_speculative_families_is_a_one_line_reason(text, why):
    with pytest.raises(metrics.ScrapeError, match=why) as e:
        metrics.parse(text)
    assert "\n" not in str(e.value)


def test_other_families_and_garbage_lines_outside_them_are_ignored():
    s = metrics.parse("\x00\xff garbage\nllamacpp:other{x=\"}\"} nope\n# TYPE x\n" + B11434)
    assert s.drafts == 15


def test_counters_that_go_down_or_disagree_are_an_absence_not_an_exception():
    after = metrics.parse(B11434)
    more = metrics.parse(B11434.replace("_drafts_total 15", "_drafts_total 40"))
    assert "went down" in metrics.request_counters(more, after)["absent"]
    odd = metrics.parse(B11434.replace("accepted_tokens_total 112", "accepted_tokens_total 200"))
    assert "inconsistent" in metrics.request_counters(metrics.Scrape(), odd)["absent"]
    assert metrics.request_counters("GET /metrics failed: TimeoutError", after) == {
        "absent": "GET /metrics failed: TimeoutError"}


def test_a_scrape_of_a_server_without_metrics_or_of_a_closed_port_says_why():
    with FakeLlamaServer() as srv:  # no counters: a server started without --metrics
        assert "501" in metrics.scrape(Endpoint(srv.port))
    assert metrics.scrape(Endpoint(9)).startswith("GET /metrics failed")
    counters = {"drafts": 2, "draft_tokens": 6, "accepted": 3, "accepted_per_pos": [2, 1, 0]}
    with FakeLlamaServer(counters=counters) as srv:
        before = metrics.scrape(Endpoint(srv.port))
        srv.count()  # one request ends
        assert metrics.request_counters(before, metrics.scrape(Endpoint(srv.port))) == counters


def test_a_run_records_each_speculative_requests_counters_and_they_agree_with_its_timings(world, models_dir):
    eng = fake()
    run_demo(world, models_dir, [eng])
    recs = records(world)
    spec = [r for r in recs if r["spec_type"] != "none"]
    assert spec and all("--metrics" in r["server_command"] for r in spec)
    assert not any("--metrics" in r["server_command"] or "spec_counters" in r for r in recs
                   if r["spec_type"] == "none")
    for r in spec:
        c = r["spec_counters"]
        assert (c["draft_tokens"], c["accepted"]) == (r["server"]["draft_n"], r["server"]["draft_n_accepted"])
        assert sum(c["accepted_per_pos"]) == c["accepted"]
    # acceptance by position comes from the counters: no request is without per-position figures
    rd = RunDir.open(world / "r" / "fake")
    pos = summarize(rd)["positions"]
    assert pos["requests_without"] == 0 and pos["note"] is None
    assert all(p["sources"] == [acc.COUNTERS] for p in pos["strategies"])
    index = CellIndex(rd.measurements())
    by = acc.positions(index, {"ngram-mod", "draft-simple"})
    ds = by[("local", "draft-simple", None)]
    assert ds.calls == sum(r["spec_counters"]["drafts"] for r in spec if r["strategy"] == "draft-simple")
