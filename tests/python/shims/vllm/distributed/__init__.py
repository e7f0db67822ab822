# STAND-IN for vLLM v0.12.0 vllm/distributed/__init__.py (parallel_state):
# reproduces only get_tensor_model_parallel_rank/world_size; not vLLM.
# Upstream they come from the initialized process groups; here a test sets
# them with set_tensor_model_parallel(rank, world).
_RANK, _WORLD = 0, 1


def set_tensor_model_parallel(rank: int, world: int) -> None:
    global _RANK, _WORLD
    _RANK, _WORLD = rank, world


def get_tensor_model_parallel_rank() -> int:
    return _RANK


def get_tensor_model_parallel_world_size() -> int:
    return _WORLD
