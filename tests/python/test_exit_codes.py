"""The exit codes are written down in three places that must agree (issue 19, item 4):
common/exit_codes.h (the constants the binaries use), docs/operations.md's table (code, meaning,
requeued) and launcher/slurm/ltm-serve.sbatch's case list (which codes it requeues). Every
constant has a row there; the codes the table says are requeued are exactly the ones the script
requeues; the ones it says are not, the script ends the job with. What each failure really ends
with is asserted where it is caused: test_mpi_multihost.py (EXIT_CODE), test_e2e_slurm.py,
test_e2e_ltm_mpirun.py, watchdog_test.
"""
import os
import re

SOURCE_DIR = os.environ.get("LTM_SOURCE_DIR", os.path.normpath(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")))


def read(*path: str) -> str:
    with open(os.path.join(SOURCE_DIR, *path)) as f:
        return f.read()


def header_codes() -> dict:
    return {int(v): k for k, v in
            re.findall(r"inline constexpr int (kExit\w+) = (\d+);", read("common", "exit_codes.h"))}


def readme_table() -> dict:
    """{code: requeued?} from the exit-code table in docs/operations.md (| code | meaning |
    requeued |)."""
    text = read("docs", "operations.md")
    start = text.index("| code | meaning | requeued |")
    rows = {}
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        for code in re.split(r",\s*", cells[0]):  # a row may list several: "134, 135, 139"
            rows[int(code)] = cells[-1] == "yes"
    return rows


def script_arms() -> dict:
    """{code: requeued?} from ltm-serve.sbatch's final `case "$rc"` (an arm that calls ltm_fail
    or exits ends the job; one that only sets `why` goes on to the requeue)."""
    text = read("launcher", "slurm", "ltm-serve.sbatch")
    block = text[text.rindex('case "$rc" in'):]
    block = block[:block.index("esac")]
    arms = {}
    for codes, body in re.findall(r"^\s*(\d+(?:\|\d+)*)\)(.*?);;", block, re.M):
        for code in codes.split("|"):  # an arm may list several: 134|135|139)
            arms[int(code)] = "ltm_fail" not in body and "exit" not in body
    return arms


def test_every_constant_has_a_readme_row():
    table = readme_table()
    missing = {code: name for code, name in header_codes().items() if code not in table}
    assert not missing, \
        f"exit codes of common/exit_codes.h without a row in docs/operations.md: {missing}"


def test_the_readme_and_the_script_requeue_the_same_codes():
    table, arms = readme_table(), script_arms()
    requeued_readme = {c for c, r in table.items() if r}
    requeued_script = {c for c, r in arms.items() if r}
    assert requeued_readme == requeued_script, (requeued_readme, requeued_script)
    for code in (c for c, r in table.items() if not r and c != 0):
        assert code in arms and not arms[code], f"{code}: docs/operations.md says not requeued"


def test_lost_peers_are_requeued():
    # The codes a lost rank, node or link ends a job with (measured in the tests named above).
    table = readme_table()
    for code in (3, 4, 5, 137):
        assert table.get(code) is True, code


def test_crashed_ranks_are_requeued():
    # SIGABRT, SIGBUS, SIGSEGV (srun's 128 + signal): test_e2e_slurm.py sends SIGSEGV.
    table, arms = readme_table(), script_arms()
    for code in (134, 135, 139):
        assert table.get(code) is True and arms.get(code) is True, code
