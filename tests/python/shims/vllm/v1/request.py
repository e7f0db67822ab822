# STAND-IN for vLLM vllm/v1/request.py (both generations): reproduces only
# Request's ids, tokens, computed / cached / external tokens, preemption
# count, status and block_hashes (kept up to date by the block hasher as
# tokens are appended), and RequestStatus with is_finished; not vLLM.
from __future__ import annotations

import enum
from typing import Callable, List, Optional


class RequestStatus(enum.IntEnum):
    WAITING = enum.auto()
    WAITING_FOR_REMOTE_KVS = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_ERROR = enum.auto()

    @staticmethod
    def is_finished(status: "RequestStatus") -> bool:
        return status > RequestStatus.PREEMPTED


class Request:

    def __init__(self, request_id: str, prompt_token_ids: List[int],
                 max_tokens: int = 1, cache_salt: Optional[str] = None,
                 block_hasher: Optional[Callable[["Request"], List[bytes]]]
                 = None) -> None:
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.output_token_ids: List[int] = []
        self.all_token_ids = list(prompt_token_ids)
        self.max_tokens = max_tokens
        self.cache_salt = cache_salt
        self.num_computed_tokens = 0
        self.num_cached_tokens = -1
        self.num_external_computed_tokens = 0
        self.num_preemptions = 0
        self.status = RequestStatus.WAITING
        self.block_hashes: List[bytes] = []
        self._hasher = block_hasher
        if block_hasher:
            self.block_hashes += block_hasher(self)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    def append_output_token_ids(self, token: int) -> None:
        self.output_token_ids.append(token)
        self.all_token_ids.append(token)
        if self._hasher:
            self.block_hashes += self._hasher(self)

    def is_finished(self) -> bool:
        return RequestStatus.is_finished(self.status)
