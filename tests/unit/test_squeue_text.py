"""The queue read as squeue's text (issue 31): parse_squeue_text on real Slurm 22.05.8 outputs
(tests/fixtures/slurm/SOURCES.md, "squeue text"), the same JobInfo as `squeue --json` of the same
jobs, and SlurmCLI.queue: one command, `--json` only where this squeue refuses the text form."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Optional

import pytest

from lingjun_slurm.common.errors import SlurmUnavailable
from lingjun_slurm.slurm.client import SQUEUE_ARGV, SQUEUE_ENV, SlurmCLI
from lingjun_slurm.slurm.parse import (
    SQUEUE_FORMAT,
    JobInfo,
    SlurmParseError,
    parse_squeue_json,
    parse_squeue_text,
)
from lingjun_slurm.transport.local import LocalTransport

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def by_id(jobs: list[JobInfo]) -> dict[str, JobInfo]:
    out = {j.job_id: j for j in jobs}
    assert len(out) == len(jobs), "duplicate job ids"
    return out


def test_the_format_is_the_one_the_fixtures_were_recorded_with() -> None:
    assert SQUEUE_FORMAT == ("ArrayJobID:|,ArrayTaskID:|,State:|,exit_code:|,StartTime:|,EndTime:|,NodeList:|,"
                             "RestartCnt:|,Reason:|,Name:0")
    assert "--json" not in SQUEUE_ARGV and "--me" in SQUEUE_ARGV and "--states=all" in SQUEUE_ARGV
    assert SQUEUE_ENV == {"SLURM_TIME_FORMAT": "%s"}


def test_every_kind_of_record_of_a_real_22_05_queue() -> None:
    jobs = by_id(parse_squeue_text(fixture("squeue_22.05_text.txt")))
    assert len(jobs) == 13
    ok = jobs["25000001"]
    assert (ok.state, ok.exit_code, ok.signal, ok.start, ok.end, ok.nodes, ok.reason) == \
        ("COMPLETED", 0, 0, 1796475726.0, 1796475726.0, "node1", None)
    assert (jobs["25000002"].state, jobs["25000002"].exit_code, jobs["25000002"].reason) == \
        ("FAILED", 7, "NonZeroExitCode")  # raw wait status 1792
    assert (jobs["25000003"].exit_code, jobs["25000003"].signal) == (None, 9)  # raw 9: killed by SIGKILL
    assert jobs["25000008"].reason == "DependencyNeverSatisfied" and jobs["25000009"].reason == "Dependency"
    held = jobs["25000007"]
    assert (held.state, held.reason, held.start, held.end, held.nodes, held.exit_code) == \
        ("PENDING", "JobHeldUser", None, None, None, None)
    running = jobs["25000004"]
    assert (running.state, running.start, running.end, running.nodes) == ("RUNNING", 1796475729.0, None, "node1")
    assert jobs["25000005"].restarts == 1 and jobs["25000005"].state == "RUNNING"
    rest = jobs["25000006_[2-7]"]  # --array=0-7%2: the pending remainder is one record, throttle removed
    assert (rest.array_job_id, rest.array_task_id, rest.array_tasks_pending, rest.reason) == \
        ("25000006", None, "2-7", "JobArrayTaskLimit")
    for task in (0, 1):
        t = jobs[f"25000006_{task}"]
        assert (t.array_job_id, t.array_task_id, t.state, t.name) == ("25000006", task, "RUNNING", "arr")
    assert jobs["25000010"].name == "spaced | name ünï 名"
    assert {j.source for j in jobs.values()} == {"squeue"}
    assert all(j.elapsed_s is None and j.flags == () for j in jobs.values())


@pytest.mark.parametrize("text,json_", [("squeue_22.05_text.txt", "squeue_22.05_text_same.json"),
                                        ("squeue_22.05_text_cancelled.txt", "squeue_22.05_text_cancelled.json")])
def test_the_text_gives_what_the_json_of_the_same_jobs_gives(text: str, json_: str) -> None:
    from_text, from_json = by_id(parse_squeue_text(fixture(text))), by_id(parse_squeue_json(fixture(json_)))
    assert from_text == from_json


def test_cancelled_jobs_and_a_cancelled_array_remainder_linger_with_their_ends() -> None:
    jobs = by_id(parse_squeue_text(fixture("squeue_22.05_text_cancelled.txt")))
    assert (jobs["25000004"].state, jobs["25000004"].signal, jobs["25000004"].end) == \
        ("CANCELLED", 15, 1796475807.0)
    assert jobs["25000006_[2-7]"].state == "CANCELLED" and jobs["25000006_[2-7]"].array_tasks_pending == "2-7"


def test_23_02_exit_code_form_and_times_slurm_prints_as_words() -> None:
    """23.02+ prints exit_code "<exit>:<signal>" (src/squeue/print.c, slurm-23-02-7-1:1725-1747)
    and nothing for NO_VAL; slurm_make_time_str prints 0/INFINITE as "Unknown", NO_VAL as "None"
    (src/common/parse_time.c, slurm-22-05-8-1:667-670). Built from the 22.05 recording's lines."""
    line = fixture("squeue_22.05_text.txt").splitlines()[2]  # fail7: 1792 (22.05's raw status)
    assert line.split("|")[3] == "1792"
    (job,) = parse_squeue_text(line.replace("|1792|", "|7:0|"))
    assert (job.exit_code, job.signal) == (7, 0)
    (job,) = parse_squeue_text(line.replace("|1792|", "|0:9|"))
    assert (job.exit_code, job.signal) == (None, 9)
    (job,) = parse_squeue_text(line.replace("|1792|", "||").replace("|1796475726|1796475726|", "|Unknown|None|"))
    assert (job.exit_code, job.signal, job.start, job.end) == (None, None, None, None)


@pytest.mark.parametrize("bad,words", [
    ("25000001|N/A|COMPLETED|0|1796475726", "has 5 fields, expected 10"),
    ("25000001|N/A|COMPLETED|0|2026-12-05T13:00:00|1796475726|node1|0|None|ok", "StartTime"),
    ("x|N/A|COMPLETED|0|1796475726|1796475726|node1|0|None|ok", "ArrayJobID"),
    ("25000001|N/A|COMPLETED|0|1796475726|1796475726|node1|many|None|ok", "RestartCnt"),
])
def test_unreadable_lines_name_the_line_and_field(bad: str, words: str) -> None:
    with pytest.raises(SlurmParseError, match="squeue line 2") as info:
        parse_squeue_text(fixture("squeue_22.05_text.txt").splitlines()[0] + "\n" + bad + "\n")
    assert words in str(info.value)


class Canned(LocalTransport):
    """Slurm's commands answered from recordings; every command kept in history."""

    def __init__(self, answers: dict[str, tuple[int, str, str]]) -> None:
        super().__init__()
        self.answers, self.envs = answers, []

    def _run(self, argv: tuple[str, ...], *, cwd: Optional[str], env: Optional[Mapping[str, str]],
             input: Optional[str], timeout: Optional[float]) -> tuple[int, str, str]:
        self.envs.append(dict(env or {}))
        key = "json" if "--json" in argv else "ping" if argv[:2] == ("scontrol", "ping") else "text"
        return self.answers[key]


def test_queue_is_one_squeue_in_text_with_epoch_times() -> None:
    t = Canned({"text": (0, fixture("squeue_22.05_text.txt"), "")})
    cli = SlurmCLI(t)
    jobs = cli.queue()
    assert t.history == [SQUEUE_ARGV] and t.envs == [{"SLURM_TIME_FORMAT": "%s"}]
    assert by_id(jobs) == by_id(parse_squeue_json(fixture("squeue_22.05_text_same.json")))
    assert cli.failed is None


def test_a_squeue_that_refuses_a_field_is_read_as_json_and_says_so() -> None:
    refused = fixture("squeue_22.05_text_refused.stderr").splitlines()[0]  # exit 0, empty fields
    t = Canned({"text": (0, "25000001|\n", refused + "\n"),
                "json": (0, fixture("squeue_22.05_text_same.json"), "")})
    cli = SlurmCLI(t)
    assert by_id(cli.queue()) == by_id(parse_squeue_json(fixture("squeue_22.05_text_same.json")))
    assert [a[:2] for a in t.history] == [("squeue", "--me"), ("squeue", "--json")]
    assert cli.failed and "Invalid job format specification: Bogus" in cli.failed and "--json" in cli.failed
    cli.queue()  # later refreshes: straight to JSON, one call
    assert [a[:2] for a in t.history[2:]] == [("squeue", "--json")]


def test_an_unknown_option_falls_back_too() -> None:
    unknown = "".join(fixture("squeue_22.05_text_refused.stderr").splitlines(keepends=True)[1:])
    t = Canned({"text": (1, "", unknown), "json": (0, fixture("squeue_22.05_text_same.json"), "")})
    cli = SlurmCLI(t)
    assert len(cli.queue()) == 13 and "unrecognized option" in (cli.failed or "")


def test_a_dead_controller_is_slurm_unavailable_in_slurms_words() -> None:
    t = Canned({"text": (1, "", fixture("squeue_22.05_text_dead.stderr")),
                "ping": (0, "Slurmctld(primary) at vm is DOWN\n", "")})
    with pytest.raises(SlurmUnavailable) as info:
        SlurmCLI(t).queue()
    assert info.value.message == ("squeue: slurm_load_jobs error: Unable to contact slurm controller (connect "
                                  "failure); scontrol ping: Slurmctld(primary) at vm is DOWN")
    assert [a[0] for a in t.history] == ["squeue", "scontrol"]


def test_unreadable_output_is_slurm_unavailable_with_the_reason() -> None:
    t = Canned({"text": (0, "garbage\n", "")})
    with pytest.raises(SlurmUnavailable, match="squeue printed what cannot be read: squeue line 1"):
        SlurmCLI(t).queue()
    assert len(t.history) == 1
