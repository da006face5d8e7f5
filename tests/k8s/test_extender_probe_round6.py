"""Round 6 of the hostile probe of the scheduler extender: its errors still carried
values from the input (a normalised quantity, an absurd size, a one-character value
quoted back) and blamed the wrong field for a sum (``spec.overhead`` reported as the
containers' requests, a GPU request as a limit)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from smartsched.k8s.snapshot import pod_model
from smartsched.model.errors import unechoed


def _pod(resources: dict[str, Any], overhead: dict[str, Any] | None = None) -> dict:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "d"},
           "spec": {"containers": [{"name": "c", "resources": resources}]}}
    if overhead is not None:
        pod["spec"]["overhead"] = overhead
    return copy.deepcopy(pod)


@pytest.mark.parametrize(("pod", "field", "echo"), [
    (_pod({"requests": {"nvidia.com/gpu": "1e-320"}}), "nvidia.com/gpu", "1E-320"),
    (_pod({"requests": {"cpu": "1E"}}), "cpu", "1000000000000000000000"),
    (_pod({"requests": {"cpu": "1"}}, {"cpu": "1E"}), "spec.overhead.cpu", "1E"),
    (_pod({"requests": {"cpu": "1"}}, {"cpu": "1e9"}), "with spec.overhead.cpu",
     "1000000000000"),
    (_pod({"requests": {"nvidia.com/gpu": "1E"}}), "(requests or limits)", "1000000"),
])
def test_quantity_errors_name_the_parts_and_quote_nothing(pod: dict, field: str,
                                                          echo: str) -> None:
    with pytest.raises(ValueError) as e:
        pod_model(pod)
    shown = unechoed(str(e.value))
    assert field in shown, shown
    assert echo not in shown, shown


def test_one_quoted_letter_or_digit_is_masked_and_punctuation_is_not() -> None:
    assert unechoed("cpu: not a quantity: '\u0661'") == "cpu: not a quantity: '...'"
    assert unechoed('x: "a"') == "x: '...'"
    assert unechoed("Expecting ',' delimiter") == "Expecting ',' delimiter"
    assert unechoed("the pod's cpu") == "the pod's cpu"
