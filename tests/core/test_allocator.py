"""`allocator.keep_freed`: a large block freed is reused without the kernel faulting its pages in
again (the reason a compare's forwards run sooner). Each case runs in a child process: the
setting is process-wide, and the test's own process must keep glibc's defaults."""

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc: Linux only")

CHILD = textwrap.dedent("""
    import resource, sys
    from smearcli.util.allocator import keep_freed
    took = keep_freed() if sys.argv[1] == "keep" else None
    faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = bytearray(64 << 20)  # 64 MB, every page written: past glibc's largest mmap threshold
    del block
    before = faults()
    block = bytearray(64 << 20)  # the same size again, after the first was freed
    print(took, faults() - before)
""")


def faults_of_second_block(mode: str) -> tuple[str, int]:
    out = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, check=True)
    took, faults = out.stdout.split()
    return took, int(faults)


def test_a_freed_block_is_reused_without_faulting_its_pages_again():
    pages = (64 << 20) // 4096
    took, faults = faults_of_second_block("keep")
    if took != "True":
        pytest.skip("not glibc: mallopt is not there")
    assert faults < pages // 10, faults  # the freed block's pages, still mapped
    _, default = faults_of_second_block("default")
    assert default > pages // 2, default  # glibc's default: unmapped when freed, faulted in again
