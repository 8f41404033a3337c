"""Calls in flight: the backlog rule, its tie, what a shared run teaches, and submitted calls
(tests/sched/test_under_load.py, tests/sched/test_submit.py)."""
from mutants.mutant import Mutant

_LOAD = "tests/sched/test_under_load.py"
_SUBMIT = "tests/sched/test_submit.py"

MUTANTS = [
    Mutant(
        name="load-decisions-blind-to-the-backlog",
        why="issue 33: a decision compares the sides' run times alone, as before, whatever is in flight (four "
            "callers put 154 of 160 calls on the GPU while the CPU idled)",
        path="hipsched/_sched.pyx",
        find="        if blc != blg:\n            # what the call costs everyone",
        replace="        if False:\n            # what the call costs everyone",
        kill=(f"{_LOAD}::test_a_busy_gpu_sends_the_next_call_to_the_idle_cpu",
              f"{_LOAD}::test_callers_in_virtual_time_finish_near_both_sides_together[4]"),
    ),
    Mutant(
        name="load-tie-to-the-busier-side",
        why="issue 33: a tie under load goes to the side with more work waiting, which keeps it busy and the "
            "other idle (two callers, a GPU exactly twice as fast: the CPU never used)",
        path="hipsched/_sched.pyx",
        find="return (GPU if blg < blc else CPU) | R_COST_MODEL << 1",
        replace="return (GPU if blg > blc else CPU) | R_COST_MODEL << 1",
        kill=(f"{_LOAD}::test_a_tie_goes_to_the_idle_side",),
    ),
    Mutant(
        name="load-cpu-sharing-costs-nothing",
        why="issue 33: a call sent to the busy CPU is charged only its own finish, not the time it takes from "
            "the calls sharing the cores with it (two callers, the GPU at half the CPU's speed: both stayed "
            "on the CPU while the GPU idled)",
        path="hipsched/_sched.pyx",
        find="            fc = blc + c + (shared if shared < c else c)",
        replace="            fc = blc + c",
        kill=(f"{_LOAD}::test_a_call_on_the_shared_cpu_counts_the_time_it_costs_the_calls_there",),
    ),
    Mutant(
        name="load-gpu-wait-of-the-caller-ahead-uncounted",
        why="issue 33: a call queued on the GPU is charged its own finish alone, not the wait it makes for the "
            "caller whose call ends first there (two callers, a GPU over twice as fast: they took turns on the "
            "GPU while the CPU idled, 0.70 of both sides)",
        path="hipsched/_sched.pyx",
        find="            fg = blg + gt + (xg if self.load[GPU].inflight else 0)",
        replace="            fg = blg + gt",
        kill=(f"{_LOAD}::test_a_call_queued_on_the_gpu_counts_the_wait_of_the_caller_ahead",
              f"{_LOAD}::test_two_callers_share_the_sides_when_the_gpu_is_over_twice_as_fast"),
    ),
    Mutant(
        name="load-gpu-wait-beyond-what-moving-costs",
        why="issue 33: the wait counted for the caller ahead is the call's whole time even where its next call "
            "would lose less by going to the CPU (a mix of ops: top_k sent to the slow CPU while the caller "
            "ahead's next call was bound for the CPU anyway)",
        path="hipsched/_sched.pyx",
        find="            xg = gt if gt < self.load[GPU].loss_us else self.load[GPU].loss_us",
        replace="            xg = gt",
        kill=(f"{_LOAD}::test_the_wait_counted_is_what_the_next_call_would_lose_by_moving",),
    ),
    Mutant(
        name="load-tie-band-without-the-backlogs-spread",
        why="issue 33: the tie under load is judged by the means' standard errors alone, so after many runs "
            "accidents of the estimates decide between finishes equal in expectation",
        path="hipsched/_sched.pyx",
        find="            se = sqrt((uc * kc) * (uc * kc) + (ug * kg) * (ug * kg) + wc * wc + wg * wg)",
        replace="            se = sqrt((uc * kc) * (uc * kc) + (ug * kg) * (ug * kg))",
        kill=(f"{_LOAD}::test_a_backlog_is_as_uncertain_as_the_runs_in_it",),
    ),
    Mutant(
        name="load-backlog-counted-from-busy-start",
        why="issue 33: the backlog counts the time spent from when the side went busy, so calls over their "
            "prediction eat the predictions of the calls behind them and the backlog falls to 0 under load",
        path="hipsched/_load.pxd",
        find="    L.since_ns = now\n    if L.inflight <= 0:",
        replace="    if L.inflight <= 0:",
        kill=(f"{_LOAD}::test_the_next_call_in_a_queue_starts_when_the_one_before_it_ends",),
    ),
    Mutant(
        name="load-shared-run-learned-whole",
        why="issue 33: a run that shared its side is learned as its whole wall time, so a side under load "
            "looks several times slower than it is",
        path="hipsched/_load.pxd",
        find="        return dur_us * wall / overlap",
        replace="        return dur_us",
        kill=(f"{_LOAD}::test_a_run_that_shared_its_side_is_learned_as_its_time_alone",),
    ),
    Mutant(
        name="load-common-path-hold-never-ends",
        why="issue 33: the compiled common path's record looks for its hold on the thread's list, where it "
            "is not: every tiny call leaves its predicted time on its side for good",
        path="hipsched/_dispatch.pyx",
        find="            self.core._record_held(&d.held, self.core.slots[d.slot], CPU,",
        replace="            self.core._record(self.core.slots[d.slot], CPU,",
        kill=(f"{_LOAD}::test_the_common_paths_hold_ends_with_its_record",),
    ),
    Mutant(
        name="submit-failed-input-passed-on",
        why="issue 33: a dependency that failed is not checked, so its dependant runs on the failed Future "
            "and raises something unrelated instead of naming its input",
        path="hipsched/submission.py",
        find="            if err is not None:\n                if call.future.set_running_or_notify_cancel():",
        replace="            if False:\n                if call.future.set_running_or_notify_cancel():",
        kill=(f"{_SUBMIT}::test_errors_name_the_op_and_the_argument",),
    ),
    Mutant(
        name="submit-cancelled-call-runs",
        why="issue 33: a call cancelled before it started runs all the same",
        path="hipsched/submission.py",
        find="            if not call.future.set_running_or_notify_cancel():\n                return\n",
        replace="            if not call.future.set_running_or_notify_cancel() and False:\n                return\n",
        kill=(f"{_SUBMIT}::test_cancelling_a_call_that_has_not_started_removes_it",),
    ),
    Mutant(
        name="batch-graph-in-submission-order",
        why="issue 33: a batch's graph is placed in the order its calls were submitted, not by the longest "
            "path left after each (HEFT's rank): a long chain's head waits behind short calls",
        path="hipsched/batch_plan.py",
        find="    for n in sorted(costs, key=lambda n: (-rank[n], n)):",
        replace="    for n in sorted(costs):",
        kill=("tests/sched/test_batch_graph.py::test_heft_takes_the_longest_remaining_path_first",),
    ),
    Mutant(
        name="batch-failed-predecessor-passed-on",
        why="issue 33: a planned call whose predecessor failed runs on the failed Future instead of failing "
            "with its input named",
        path="hipsched/batch.py",
        find="                if err is not None:\n                    waited = 0.0",
        replace="                if False:\n                    waited = 0.0",
        kill=("tests/sched/test_batch_graph.py::test_a_failed_predecessor_fails_its_dependants_in_the_plan",),
    ),
]
