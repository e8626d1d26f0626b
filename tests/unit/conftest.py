import pytest


@pytest.fixture(scope="module")
def gloo():
    """A world-size-1 gloo process group (rank 0, this process) for the module's tests, destroyed after them."""
    from tests.support.fsdp_helpers import single_process_group

    with single_process_group("gloo"):
        yield
