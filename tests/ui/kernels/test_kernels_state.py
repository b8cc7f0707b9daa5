"""The Kernels page's URL schema: parsed like typed input, and encoding then parsing gives the same run back."""

from hypothesis import given
from hypothesis import strategies as st

from core.kernels.timing import KernelConfig
from ui.kernels.state import FIELDS, config_of, parse_backends, parse_kernel_params, url_params

AVAILABLE = ["cpu", "torch", "gather"]


def test_backends_keep_the_order_given_and_drop_what_this_machine_lacks():
    assert parse_backends("gather,torch", AVAILABLE) == (["gather", "torch"], [])
    assert parse_backends(" torch , torch ,", AVAILABLE) == (["torch"], [])
    chosen, messages = parse_backends("triton,torch", AVAILABLE)
    assert chosen == ["torch"] and "'triton' not available on this machine" in messages[0]
    assert "using the rest" in messages[0]
    chosen, messages = parse_backends("triton", AVAILABLE)
    assert chosen == AVAILABLE and "using all of them" in messages[0]
    assert parse_backends("", AVAILABLE) == (AVAILABLE, [])


def test_defaults_are_the_page_defaults_and_describe_the_documented_problem():
    values, messages = parse_kernel_params({}, AVAILABLE)
    assert not messages
    assert config_of(values) == KernelConfig(
        batch=4, context_len=1024
    )  # 32 / 8 heads, 128 dims, blocks of 16
    assert url_params(values) == {
        "heads": "32",
        "kv_heads": "8",
        "head_dim": "128",
        "block": "16",
        "batch": "4",
        "ctx": "1024",
        "dtype": "float32",
        "window": "0",
        "backends": "cpu,torch,gather",
    }


def test_bad_values_fall_back_with_a_reason():
    values, messages = parse_kernel_params({"ctx": "0", "dtype": "fp64", "window": "1e3"}, AVAILABLE)
    assert (values["ctx"], values["dtype"], values["window"]) == (1024, "float32", 0)
    assert len(messages) == 3
    assert (
        "must be at least 1" in messages[0]
        and "unknown value" in messages[1]
        and "whole number" in messages[2]
    )


FIELD = {field.key: field for field in FIELDS}


@given(
    heads=st.sampled_from(FIELD["heads"].choices),
    kv_heads=st.sampled_from(FIELD["kv_heads"].choices),
    head_dim=st.sampled_from(FIELD["head_dim"].choices),
    block=st.sampled_from(FIELD["block"].choices),
    batch=st.integers(1, 4096),
    ctx=st.integers(1, 1_048_576),
    dtype=st.sampled_from(FIELD["dtype"].choices),
    window=st.integers(0, 1_048_576),
    backends=st.lists(st.sampled_from(AVAILABLE), min_size=1, unique=True),
)
def test_a_link_round_trips_to_the_same_run(**values):
    parsed, messages = parse_kernel_params(url_params(values), AVAILABLE)
    assert not messages
    assert parsed == values
    assert config_of(parsed) == config_of(values)
