"""The one consumer of DLPack capsules (hipsched/gpu/memory/_dlpack_import.pyx), which the compiled call path
and DeviceArray.from_external both read foreign tensors through."""
from mutants.mutant import Mutant

IMPORT = "hipsched/gpu/memory/_dlpack_import.pyx"
TESTS = "tests/gpu/runtime/test_device_array.py"

MUTANTS = [
    Mutant(
        name="dlpack-import-drops-byte-offset",
        why="issue 31: a tensor whose data starts byte_offset bytes into its allocation is read from the "
            "allocation's start (every producer but one the test builds writes 0, so only it can tell)",
        path=IMPORT,
        find="    hold.ptr = <size_t>d.data + <size_t>d.byte_offset\n",
        replace="    hold.ptr = <size_t>d.data\n",
        kill=(f"{TESTS}::test_consume_reads_offset_strides_and_type_and_hands_the_tensor_back_once",),
    ),
    Mutant(
        name="dlpack-import-never-hands-back",
        why="issue 31: the producer's deleter never runs, so every consumed tensor (and its producer's "
            "memory) is kept for good",
        path=IMPORT,
        find="    def __dealloc__(self):\n        cdef DLManagedTensor *m = self.m\n        self.m = NULL\n"
             "        if m != NULL and m.deleter != NULL and not _exiting:\n            m.deleter(m)\n",
        replace="    def __dealloc__(self):\n        self.m = NULL\n",
        kill=(f"{TESTS}::test_consume_reads_offset_strides_and_type_and_hands_the_tensor_back_once",),
    ),
]
