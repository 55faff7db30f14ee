"""The `gpu` pool and what a GPU step asks Kubernetes for.

Every GPU asset uses ``pool=GPU_POOL`` (the instance caps how many run at once: 1 locally, the GPU
count in the Helm values) and ``op_tags=GPU_OP_TAGS``: under the ``k8s_job_executor`` each step is its
own pod, and dagster-k8s turns the ``dagster-k8s/config`` tag into that pod's spec: one
``nvidia.com/gpu``, the GPU nodes' label as node selector, and a toleration for their taint. CPU
steps carry no such tag, so they request no GPU and schedule on any node.
"""

import os

GPU_POOL = "gpu"

GPU_NODE_SELECTOR_ENV = "SPEECHDATA_GPU_NODE_SELECTOR"
DEFAULT_GPU_NODE_SELECTOR = "nvidia.com/gpu.present=true"
"""The label NVIDIA's GPU feature discovery (GPU operator) puts on GPU nodes; GKE's is
``cloud.google.com/gke-accelerator=<type>``, EKS node groups often ``node.kubernetes.io/instance-type=<type>``."""

GPU_TOLERATIONS = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
"""GPU node pools are usually tainted so that CPU pods stay off them (GKE and EKS taint this key)."""


def gpu_node_selector(value: str | None = None) -> dict[str, str]:
    """``key=value[,key=value]`` (``SPEECHDATA_GPU_NODE_SELECTOR``, read where the code location loads)."""
    text = value if value is not None else os.environ.get(GPU_NODE_SELECTOR_ENV, DEFAULT_GPU_NODE_SELECTOR)
    pairs = [item.split("=", 1) for item in text.split(",") if item.strip()]
    if not pairs or any(len(pair) != 2 or not pair[0].strip() for pair in pairs):
        raise ValueError(f"{GPU_NODE_SELECTOR_ENV} wants key=value[,key=value], got {text!r}")
    return {key.strip(): val.strip() for key, val in pairs}


def gpu_op_tags(node_selector: dict[str, str] | None = None) -> dict:
    """The ``dagster-k8s/config`` tag of a step that needs one GPU."""
    return {
        "dagster-k8s/config": {
            "container_config": {"resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}}},
            "pod_spec_config": {
                "node_selector": node_selector if node_selector is not None else gpu_node_selector(),
                "tolerations": GPU_TOLERATIONS,
            },
        }
    }


GPU_OP_TAGS = gpu_op_tags()
