# STAND-IN for vLLM v0.12.0 vllm/v1/core/sched/scheduler.py: reproduces only
# the KV connector's part of the v1 scheduler: per step, running requests
# first (preempting the newest when blocks run out), then waiting ones
# (local prefix hits, connector.get_num_new_matched_tokens, None = skip for
# now, allocate, connector.update_state_after_alloc, async loads parked in
# WAITING_FOR_REMOTE_KVS until the workers report them finished_recving),
# connector.build_connector_meta; after the step, invalid (failed-load)
# blocks truncate the affected requests' computed tokens (they are
# recomputed), finished_sending frees delayed blocks,
# connector.update_connector_output; finishing calls
# connector.request_finished (delay_free); nothing from the waiting queue in
# a step that preempted. No chunked prefill, no token
# budget, one KV cache group, no spec decode; not vLLM.
from __future__ import annotations

import dataclasses
from collections import deque
from typing import Any, Deque, Dict, List, Optional, Set

from ...outputs import KVConnectorOutput
from ...request import Request, RequestStatus
from ..kv_cache_manager import KVCacheBlocks, KVCacheManager
from .output import CachedRequestData, NewRequestData, SchedulerOutput


@dataclasses.dataclass
class ModelRunnerOutput:
    """vllm/v1/outputs.py ModelRunnerOutput, reduced: one sampled token per
    request that finished its prompt, the connector's report."""
    sampled: Dict[str, int]
    kv_connector_output: Optional[KVConnectorOutput] = None
    logits: Dict[str, Any] = dataclasses.field(default_factory=dict)


class Scheduler:

    def __init__(self, kv_cache_manager: KVCacheManager,
                 connector: Any = None) -> None:
        self.kv_cache_manager = kv_cache_manager
        self.block_size = kv_cache_manager.block_size
        self.connector = connector
        self.requests: Dict[str, Request] = {}
        self.waiting: Deque[Request] = deque()
        self.running: List[Request] = []
        self.finished_req_ids: Set[str] = set()
        self.finished_recving_kv_req_ids: Set[str] = set()
        self.failed_recving_kv_req_ids: Set[str] = set()
        self.delayed_free: Set[str] = set()
        self._to_preempt: Set[str] = set()
        self._preempted: Set[str] = set()
        self._seen: Set[str] = set()       # requests the workers know

    def add_request(self, request: Request) -> None:
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def preempt(self, req_id: str) -> None:
        """Test hook: preempt this running request at the next step (as
        vLLM does when blocks run out)."""
        self._to_preempt.add(req_id)

    def _preempt(self, req: Request) -> None:
        self.running.remove(req)
        self.kv_cache_manager.free(req)
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        self.waiting.appendleft(req)
        self._preempted.add(req.request_id)

    def finish_requests(self, req_id: str, status: RequestStatus =
                        RequestStatus.FINISHED_ABORTED) -> None:
        req = self.requests[req_id]
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        req.status = status
        self._free_request(req)

    def _free_request(self, req: Request) -> None:
        delay, _ = (self.connector.request_finished(
            req, self.kv_cache_manager.get_block_ids(req.request_id)[0])
            if self.connector else (False, None))
        self.finished_req_ids.add(req.request_id)
        if delay:
            self.delayed_free.add(req.request_id)
        else:
            self._free_blocks(req)

    def _free_blocks(self, req: Request) -> None:
        self.kv_cache_manager.free(req)
        self.requests.pop(req.request_id, None)

    def has_requests(self) -> bool:
        return bool(self.waiting or self.running or self.delayed_free)

    # -- one step ------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        new_reqs: List[NewRequestData] = []
        cached = CachedRequestData()
        num_sched: Dict[str, int] = {}
        for rid in list(self._to_preempt):
            req = self.requests.get(rid)
            if req is not None and req in self.running:
                self._preempt(req)
        self._to_preempt.clear()
        for req in list(self.running):
            if req not in self.running:
                continue
            n = max(req.num_tokens - req.num_computed_tokens, 1)
            while True:
                blocks = self.kv_cache_manager.allocate_slots(req, n)
                if blocks is not None:
                    break
                victim = self.running[-1]
                self._preempt(victim)
                if victim is req:
                    break
            if blocks is None:
                continue
            cached.req_ids.append(req.request_id)
            cached.resumed_from_preemption.append(False)
            ids = blocks.get_block_ids()[0]
            cached.new_block_ids.append((ids,) if ids else None)
            cached.num_computed_tokens.append(req.num_computed_tokens)
            num_sched[req.request_id] = n
        skipped: Deque[Request] = deque()
        # as upstream: no waiting request is scheduled in a step that
        # preempted (the preempted one waits at least a step)
        while self.waiting and not self._preempted:
            req = self.waiting.popleft()
            rid = req.request_id
            if req.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                if not self._update_waiting_for_remote_kv(req):
                    skipped.append(req)
                    continue
            ext, load_async = 0, False
            if req.num_computed_tokens == 0:
                comp, local = self.kv_cache_manager.get_computed_blocks(req)
                if self.connector is not None:
                    ext, load_async = self.connector.get_num_new_matched_tokens(
                        req, local)
                    if ext is None:            # ask again next step
                        skipped.append(req)
                        continue
            else:
                comp, local = KVCacheBlocks([]), 0
            computed = req.num_computed_tokens + local + ext
            n = 0 if load_async else req.num_tokens - computed
            blocks = self.kv_cache_manager.allocate_slots(req, n + ext, local,
                                                          comp)
            if blocks is None:
                skipped.append(req)
                break
            if self.connector is not None:
                self.connector.update_state_after_alloc(req, comp + blocks,
                                                        ext)
            req.num_computed_tokens = computed
            if load_async:
                req.status = RequestStatus.WAITING_FOR_REMOTE_KVS
                skipped.append(req)
                continue
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            ids = self.kv_cache_manager.get_block_ids(rid)[0]
            if rid in self._seen:            # resumed after preemption
                cached.req_ids.append(rid)
                cached.resumed_from_preemption.append(True)
                cached.new_block_ids.append((ids,))
                cached.num_computed_tokens.append(computed)
            else:
                new_reqs.append(NewRequestData(rid, list(req.prompt_token_ids),
                                               (ids,), computed))
            self._seen.add(rid)
            num_sched[rid] = n
        self.waiting.extendleft(reversed(skipped))
        out = SchedulerOutput(new_reqs, cached, num_sched,
                              self.finished_req_ids, self._preempted)
        self.finished_req_ids = set()
        self._preempted = set()
        if self.connector is not None:
            out.kv_connector_metadata = self.connector.build_connector_meta(out)
        for rid, n in num_sched.items():          # _update_after_schedule
            self.requests[rid].num_computed_tokens += n
        return out

    def _update_waiting_for_remote_kv(self, req: Request) -> bool:
        rid = req.request_id
        if rid not in self.finished_recving_kv_req_ids:
            return False
        if rid in self.failed_recving_kv_req_ids:
            self.failed_recving_kv_req_ids.discard(rid)
            if req.num_computed_tokens == 0:
                self.kv_cache_manager.free(req)
        self.kv_cache_manager.cache_blocks(req, req.num_computed_tokens)
        self.finished_recving_kv_req_ids.discard(rid)
        req.status = RequestStatus.WAITING
        return True

    # -- after the step --------------------------------------------------------

    def _handle_invalid_blocks(self, invalid: Set[int]) -> Set[str]:
        """Requests whose computed blocks include a failed load go back to
        the first failed block (those tokens are recomputed)."""
        affected: Set[str] = set()
        self.kv_cache_manager.forget(invalid)
        for req in list(self.running) + list(self.waiting):
            ids = self.kv_cache_manager.get_block_ids(req.request_id)[0]
            ncomp = -(-req.num_computed_tokens // self.block_size)
            bad = [i for i, b in enumerate(ids[:ncomp]) if b in invalid]
            if not bad:
                continue
            req.num_computed_tokens = min(req.num_computed_tokens,
                                          bad[0] * self.block_size)
            affected.add(req.request_id)
            if req.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                self.failed_recving_kv_req_ids.add(req.request_id)
        return affected

    def update_from_output(self, out: SchedulerOutput,
                           mro: ModelRunnerOutput) -> List[str]:
        """Apply a step's results; returns the requests that finished."""
        kvo = mro.kv_connector_output
        bad: Set[str] = set()
        if kvo is not None and kvo.invalid_block_ids:
            bad = self._handle_invalid_blocks(kvo.invalid_block_ids)
        done: List[str] = []
        for rid in out.num_scheduled_tokens:
            req = self.requests.get(rid)
            if req is None or req not in self.running or rid in bad:
                continue
            self.kv_cache_manager.cache_blocks(req, req.num_computed_tokens)
            if req.num_computed_tokens >= req.num_tokens and \
                    rid in mro.sampled:
                req.append_output_token_ids(mro.sampled[rid])
                if len(req.output_token_ids) >= req.max_tokens:
                    self.running.remove(req)
                    req.status = RequestStatus.FINISHED_LENGTH_CAPPED
                    self._free_request(req)
                    done.append(rid)
        if kvo is not None:
            for rid in kvo.finished_recving or ():
                if rid in self.requests:
                    self.finished_recving_kv_req_ids.add(rid)
            for rid in kvo.finished_sending or ():
                self.delayed_free.discard(rid)
                req = self.requests.get(rid)
                if req is not None:
                    self._free_blocks(req)
            if self.connector is not None:
                self.connector.update_connector_output(kvo)
        return done
