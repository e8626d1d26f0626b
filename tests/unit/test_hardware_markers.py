"""conftest.py's hardware markers: which tests skip where (decided on markers, never on directory names)."""

from conftest import hardware_skip_reason


def test_vllm_cpu_tests_run_only_with_vllms_cpu_build():
    assert hardware_skip_reason({"vllm_cpu"}, has_cuda=False, vllm_version="0.33.0+cpu") is None
    assert "CPU build" in hardware_skip_reason({"vllm_cpu"}, has_cuda=False, vllm_version=None)
    assert "CPU build" in hardware_skip_reason({"vllm_cpu"}, has_cuda=True, vllm_version="0.33.0")


def test_cuda_vllm_and_gpu_markers_need_cuda():
    assert hardware_skip_reason({"vllm", "gpu"}, has_cuda=True, vllm_version="0.33.0") is None
    assert "CUDA" in hardware_skip_reason({"vllm"}, has_cuda=False, vllm_version="0.33.0+cpu")
    assert "CUDA" in hardware_skip_reason({"gpu"}, has_cuda=False, vllm_version=None)


def test_unmarked_tests_run_everywhere():
    assert hardware_skip_reason(set(), has_cuda=False, vllm_version=None) is None



def test_the_ci_profile_caps_a_property_tests_own_example_count(monkeypatch):
    """CI runs each property test short (its own max_examples above conftest.CI_EXAMPLES included); the long
    profile (nox -s hypothesis_long) runs the test's own count."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    import conftest

    seen: list[int] = []

    @settings(max_examples=200, derandomize=True, database=None)
    @given(st.integers())
    def prop(x):
        seen.append(x)

    monkeypatch.setattr(conftest, "PROFILE", "long")
    conftest.capped_examples(prop)
    assert prop._hypothesis_internal_use_settings.max_examples == 200
    monkeypatch.setattr(conftest, "PROFILE", "ci")
    conftest.capped_examples(prop)
    prop()
    assert 0 < len(seen) <= conftest.CI_EXAMPLES
