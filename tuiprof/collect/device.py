"""Facts about where a session runs, read once: the GPU (name, SM count) and the process's place
in a distributed job (rank, world size, local rank). They go into the store's metadata for the
launch analysis, the header and the cross-rank views."""
from __future__ import annotations


def rank_facts() -> dict:
    """This process's place in a distributed job, from the torchrun environment (empty outside
    one): whatever runs the steps (tuiprof's engine or a user's program), each rank's store
    says which rank it is, so the UI process can put the ranks side by side."""
    from ..engine.distributed import RankInfo  # noqa: PLC0415 - no torch at import

    info = RankInfo.from_env()
    if info is None or info.world_size < 2:
        return {}
    return {"rank": info.rank, "world_size": info.world_size, "local_rank": info.local_rank,
            "device_index": info.local_rank}


def device_facts(device: str) -> dict:
    """SM count and device name for launch analysis (empty on CPU)."""
    if not str(device).startswith("cuda"):
        return {}
    import torch  # noqa: PLC0415

    props = torch.cuda.get_device_properties(torch.device(device))
    return {"sm_count": props.multi_processor_count, "device_name": props.name}

