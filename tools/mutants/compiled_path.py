"""The compiled GPU call path (hipsched/gpu/launch/_callpath.pyx, gpu/bindings/_driver.pyx, _dispatch.pyx):
lifetimes of foreign inputs, cross-stream ordering, a closed backend, devices other than the first."""
from mutants.mutant import Mutant

CALLPATH = "hipsched/gpu/launch/_callpath.pyx"
TESTS = "tests/gpu/emulator/test_compiled_call_path.py"

MUTANTS = [
    Mutant(
        name="callpath-no-foreign-hold",
        why="issue 30 item 2: foreign inputs (a consumed DLPack tensor, a DeviceArray over foreign memory) "
            "let go when the call returns, not when their work has run",
        path=CALLPATH,
        find="        self._reap(False)\n        if foreign is None:\n            return\n",
        replace="        self._reap(False)\n        return\n",
        kill=(f"{TESTS}::test_a_foreign_input_dropped_on_a_non_blocking_stream_is_held_until_its_work_has_run",),
    ),
    Mutant(
        name="callpath-no-producer-wait",
        why="issue 30 item 3: a replay does not order its stream after the stream that produced an input",
        path=CALLPATH,
        find="if ins.producer[i] >= 0 and <size_t>ins.producer[i] != stream:",
        replace="if False:",
        kill=(f"{TESTS}::test_an_input_made_on_another_stream_is_read_after_its_producer",),
    ),
]
MUTANTS.append(Mutant(
    name="callpath-replays-after-close",
    why="issue 30 item 5: the dispatcher replays through a closed GPU backend's compiled path (the old test "
        "called with host arrays, whose key no plan has, so no replay could happen)",
    path="hipsched/_dispatch.pyx",
    find="if gp is not None and gp.enabled and not (kwargs",
    replace="if gp is not None and not (kwargs",
    kill=("tests/gpu/runtime/test_call_path_cost.py::test_a_closed_backend_replays_nothing",),
))
MUTANTS += [
    Mutant(
        name="driver-copied-to-device-view",
        why="issue 30 item 6: Runtime.for_device's view keeps the compiled path's Driver of the device it "
            "was made from (the defect this found: device 1's replays ran in device 0's context)",
        path="hipsched/gpu/bindings/runtime.py",
        find='        view.__dict__.pop("_c_driver", None)\n',
        replace="",
        kill=(f"{TESTS}::test_the_compiled_path_replays_on_the_second_device",),
    ),
    Mutant(
        name="driver-hip-never-sets-device",
        why="issue 30 item 6: on HIP the Driver trusts whatever device is current (the double always "
            "reported CUDA, so the HIP branch never ran)",
        path="hipsched/gpu/bindings/_driver.pyx",
        find="        if status != 0 or dev != self.device:\n            return self.set_device(self.device)\n",
        replace="",
        kill=(f"{TESTS}::test_the_compiled_path_replays_on_the_second_device",),
    ),
]
MUTANTS.append(Mutant(
    name="callpath-staged-results-misplaced",
    why="issue 30 item 6: a replay with host results reads every result from the start of the staging "
        "buffer (the op matrix's host forms never went through the compiled path)",
    path=CALLPATH,
    find="memcpy(cnp.PyArray_DATA(a), <char *>stage + <size_t>r[5], nbytes)",
    replace="memcpy(cnp.PyArray_DATA(a), <char *>stage, nbytes)",
    kill=("tests/gpu/emulator/test_executor_op_matrix.py::test_op_dtype_matrix[emulator-top_k-float32-vector-host]",),
))
MUTANTS += [
    Mutant(
        name="callpath-failed-launch-keeps-scratch",
        why="issue 30 item 7: a replay whose launch fails midway through its plan never frees the scratch",
        path=CALLPATH,
        find="        if scratch != NULL:\n            drv.free_async(scratch, s)   # in stream order",
        replace="        if scratch != NULL and status == 0:\n"
                "            drv.free_async(scratch, s)   # in stream order",
        kill=(f"{TESTS}::test_a_failure_midway_through_a_multi_launch_plan",),
    ),
    Mutant(
        name="fallback-rerun-failure-unexplained",
        why="issue 30 item 7: a CPU rerun that cannot read the device inputs (the failure took the device) "
            "raises its own unrelated error, as a destroyed stream did after 'rerunning on the CPU'",
        path="hipsched/_dispatch.pyx",
        find="            except GpuError as e:\n                # the rerun downloads the inputs",
        replace="            except ZeroDivisionError as e:\n                # the rerun downloads the inputs",
        kill=(f"{TESTS}::test_a_failure_that_takes_the_device_raises_without_announcing_a_rerun",),
    ),
    Mutant(
        name="refused-recording-asked-again",
        why="issue 31: a call whose glue run the recorder refuses (the vendor BLAS...) recorded and exported "
            "its arguments again at every call",
        path="hipsched/_dispatch.pyx",
        find="                if key in self.unrecordable:\n                    key = None",
        replace="                if False:\n                    key = None",
        kill=("tests/gpu/emulator/test_compiled_call_path.py::test_runs_the_recorder_refuses_keep_going_through_the_glue",),
    ),
]
