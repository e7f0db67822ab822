# STAND-IN for vLLM vllm/v1/core/sched/scheduler.py, re-derived from the
# upstream text at 00024d314514900f361ad072af6931e403b7f589 ("current"; the
# v0.12.0 differences noted where the generation of vllm/__init__.py picks
# them). Reproduces only the KV connector's part of the v1 scheduler, in
# upstream's order:
#   schedule(): RUNNING requests first under the step's token budget
#     (long_prefill_token_threshold, max_model_len not modelled), each
#     allocate_slots retried after preempting the last running request
#     (FCFS) until it fits or the request itself was preempted; then, only
#     if nothing was preempted, WAITING requests while the budget and
#     max_num_seqs allow: WAITING_FOR_REMOTE_KVS ones through
#     _update_waiting_for_remote_kv (resumed ones become PREEMPTED again),
#     local prefix hits (num_computed_tokens == 0 only), the connector's
#     get_num_new_matched_tokens (None: skip for now), async loads allocate
#     for the external tokens only and park in WAITING_FOR_REMOTE_KVS,
#     otherwise chunked prefill (min(tokens left, budget); without chunked
#     prefill a prompt over the budget stops the loop), allocate_slots,
#     update_state_after_alloc (current: all the request's blocks; v0.12:
#     the local hits plus the new blocks); SchedulerOutput (preempted and
#     finished ids), build_connector_meta, _update_after_schedule.
#   update_from_output(): invalid blocks first (_handle_invalid_blocks,
#     recompute policy), then per scheduled request its sampled token,
#     stop at max_tokens, _free_request (request_finished -> delay_free);
#     then _update_from_kv_xfer_finished: update_connector_output BEFORE
#     freeing, then finished_recving (asserting the request is live:
#     parked ones become ready, finished ones are freed) and
#     finished_sending (asserting it is live; freed).
#   finish_requests(): an abort; a request still waiting for its load is
#     freed late (delay) unless its load was already reported done.
#   has_requests(): unfinished requests or finished ids not yet sent to
#     the workers (upstream stops stepping when only delayed frees remain),
#     or, in current vLLM, a connector with has_pending_push_work().
# has_sync_kv_loads (current): set when a request scheduled this step has
# external tokens loaded synchronously (load_is_async False) — derived from
# the workers' use of it at 00f4240ee645 ("sync loads feed this step's
# forward"), the scheduler not re-read at that commit. failed_recving
# (current): the request recomputes from token 0 (the recompute policy, as
# third-party connectors written against it describe; not re-read here).
# Several KV cache groups (a HybridKVCacheManager), as 00f4240ee6458263d76cf51ca7901ce1350bb4d1
# has them: _connector_finished frees out-of-window blocks
# (remove_skipped_blocks) before handing every group's block table to a
# SupportsHMA connector's request_finished_all_groups (one group's to
# request_finished otherwise, asserting one group); _handle_invalid_blocks
# raises RuntimeError for several groups (failed_recving is the way);
# _update_waiting_for_remote_kv takes any number of groups (at
# 00024d314514, the "v0.26" reading, it unpacks exactly one, as does
# _update_requests_with_invalid_blocks at both).
# A mamba group in "align" mode (the kv cache manager's has_state):
# _mamba_block_aligned_split as 00f4240ee645 has it (its parameters and the
# external tokens counted read at that commit; its body as copies of
# upstream's text close to it give it), applied to running and waiting
# requests' prefill chunks.
# Not reproduced: priorities, LoRA, encoder inputs, spec decode, async
# scheduling, pipeline parallelism, structured output, KV events, stats,
# the "fail" load-failure policy, local prefix hits under several groups.
# Not vLLM.
from __future__ import annotations

import dataclasses
from collections import deque
from typing import Any, Deque, Dict, List, Optional, Set

from vllm import GENERATION as _GEN

from ...outputs import KVConnectorOutput
if _GEN != "v0.12":
    from vllm.distributed.kv_transfer.kv_connector.v1.base import \
        supports_hma
from ...request import Request, RequestStatus
from ..kv_cache_manager import KVCacheBlocks, KVCacheManager
from .output import CachedRequestData, NewRequestData, SchedulerOutput


@dataclasses.dataclass
class ModelRunnerOutput:
    """vllm/v1/outputs.py ModelRunnerOutput, reduced: the token sampled for
    each request whose scheduled tokens reached its end, the connector's
    report, and (for the tests) the logits."""
    sampled: Dict[str, int]
    kv_connector_output: Optional[KVConnectorOutput] = None
    logits: Dict[str, Any] = dataclasses.field(default_factory=dict)


class Scheduler:

    def __init__(self, kv_cache_manager: KVCacheManager,
                 connector: Any = None, scheduler_config: Any = None) -> None:
        from vllm.config import SchedulerConfig
        cfg = scheduler_config or SchedulerConfig()
        self.kv_cache_manager = kv_cache_manager
        # KV cache groups (HybridKVCacheManager: several)
        self.num_groups = len(getattr(kv_cache_manager, "windows", (0,)))
        self.block_size = kv_cache_manager.block_size
        # a mamba group in "align" mode: prefills split at block boundaries
        self.need_mamba_block_aligned_split = bool(
            getattr(kv_cache_manager, "has_state", False))
        self.connector = connector
        self.max_num_scheduled_tokens = cfg.max_num_batched_tokens
        self.max_num_running_reqs = cfg.max_num_seqs
        self.enable_chunked_prefill = cfg.enable_chunked_prefill
        self.long_prefill_token_threshold = cfg.long_prefill_token_threshold
        self.requests: Dict[str, Request] = {}
        self.waiting: Deque[Request] = deque()
        self.running: List[Request] = []
        self.finished_req_ids: Set[str] = set()
        self.finished_recving_kv_req_ids: Set[str] = set()
        self.failed_recving_kv_req_ids: Set[str] = set()
        self.prev_step_scheduled_req_ids: Set[str] = set()
        self._to_preempt: Set[str] = set()

    # -- requests --------------------------------------------------------------

    def add_request(self, request: Request) -> None:
        self.waiting.append(request)
        self.requests[request.request_id] = request
        if self.connector is not None and hasattr(self.connector,
                                                  "on_new_request"):
            self.connector.on_new_request(request)

    def preempt(self, req_id: str) -> None:
        """NOT UPSTREAM (a test hook): preempt this running request at the
        start of the next schedule(), as upstream does when its blocks run
        out (the same _preempt_request)."""
        self._to_preempt.add(req_id)

    @property
    def delayed_free(self) -> Set[str]:
        """Finished requests whose blocks the connector still holds."""
        return {rid for rid, r in self.requests.items() if r.is_finished()}

    def has_requests(self) -> bool:
        push = getattr(self.connector, "has_pending_push_work", None)
        return bool(self.waiting or self.running or self.finished_req_ids or
                    (push is not None and push()))

    def finish_requests(self, request_ids: Any,
                        finished_status: RequestStatus =
                        RequestStatus.FINISHED_ABORTED) -> None:
        assert RequestStatus.is_finished(finished_status)
        if isinstance(request_ids, str):
            request_ids = (request_ids,)
        valid = []
        for rid in request_ids:
            req = self.requests.get(rid)
            if req is None or req.is_finished():
                continue
            valid.append(req)
            if req.status == RequestStatus.RUNNING:
                self.running.remove(req)
            else:
                self.waiting.remove(req)
        for req in valid:
            delay = False
            if req.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                delay = req.request_id not in self.finished_recving_kv_req_ids
                self.finished_recving_kv_req_ids.discard(req.request_id)
                self.failed_recving_kv_req_ids.discard(req.request_id)
            req.status = finished_status
            self._free_request(req, delay)

    def _free_request(self, req: Request, delay_free_blocks: bool = False
                      ) -> None:
        assert req.is_finished()
        delay = False
        if self.connector is not None:
            delay, _ = self._connector_finished(req)
        self.finished_req_ids.add(req.request_id)
        if not (delay or delay_free_blocks):
            self._free_blocks(req)

    def _connector_finished(self, req: Request) -> Any:
        """v0.26 / current: out-of-window blocks are freed first, then the
        block table of every group goes to request_finished_all_groups
        (SupportsHMA) or, with one group, group 0's to request_finished
        (upstream asserts one group there)."""
        kvm = self.kv_cache_manager
        if _GEN == "v0.12":
            return self.connector.request_finished(
                req, kvm.get_block_ids(req.request_id)[0])
        if hasattr(kvm, "remove_skipped_blocks"):
            kvm.remove_skipped_blocks(req.request_id, req.num_computed_tokens)
        block_ids = kvm.get_block_ids(req.request_id)
        if not supports_hma(self.connector):
            assert self.num_groups == 1
            return self.connector.request_finished(req, block_ids[0])
        return self.connector.request_finished_all_groups(req, block_ids)

    def _free_blocks(self, req: Request) -> None:
        assert req.is_finished()
        self.kv_cache_manager.free(req)
        del self.requests[req.request_id]

    def _preempt_request(self, req: Request) -> None:
        assert req.status == RequestStatus.RUNNING
        self.kv_cache_manager.free(req)
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.waiting.appendleft(req)

    # -- one step ----------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        kvm = self.kv_cache_manager
        new_reqs: List[Request] = []
        resumed_reqs: List[Request] = []
        running_reqs: List[Request] = []
        preempted: List[Request] = []
        new_blocks_of: Dict[str, KVCacheBlocks] = {}
        num_sched: Dict[str, int] = {}
        sync_loads = False
        budget = self.max_num_scheduled_tokens
        kvm.new_step_starts()
        for rid in sorted(self._to_preempt):
            req = self.requests.get(rid)
            if req is not None and req in self.running:
                self.running.remove(req)
                self._preempt_request(req)
                preempted.append(req)
        self._to_preempt.clear()

        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = req.num_tokens - req.num_computed_tokens
            if 0 < self.long_prefill_token_threshold < n:
                n = self.long_prefill_token_threshold
            n = min(n, budget)
            if self.need_mamba_block_aligned_split:
                n = self._mamba_block_aligned_split(req, n)
            if n == 0:
                i += 1
                continue
            while True:
                blocks = kvm.allocate_slots(req, n)
                if blocks is not None:
                    break
                victim = self.running.pop()
                self._preempt_request(victim)
                preempted.append(victim)
                if victim is req:
                    break
            if blocks is None:
                break
            running_reqs.append(req)
            new_blocks_of[req.request_id] = blocks
            num_sched[req.request_id] = n
            budget -= n
            i += 1

        if not preempted:
            skipped: Deque[Request] = deque()
            while self.waiting and budget > 0:
                if len(self.running) == self.max_num_running_reqs:
                    break
                req = self.waiting[0]
                rid = req.request_id
                if req.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                    if self._update_waiting_for_remote_kv(req):
                        req.status = (RequestStatus.PREEMPTED
                                      if req.num_preemptions
                                      else RequestStatus.WAITING)
                    else:
                        skipped.append(self.waiting.popleft())
                        continue
                ext, load_async = 0, False
                if req.num_computed_tokens == 0:
                    comp, local = kvm.get_computed_blocks(req)
                    if self.connector is not None:
                        ext, load_async = \
                            self.connector.get_num_new_matched_tokens(
                                req, local)
                        if ext is None:     # the connector needs time
                            skipped.append(self.waiting.popleft())
                            continue
                        req.num_external_computed_tokens = ext
                    computed = local + ext
                else:   # a finished async load set num_computed_tokens
                    comp, local = kvm.empty_kv_cache_blocks, 0
                    computed = req.num_computed_tokens
                if load_async:
                    assert ext > 0
                    n = 0
                else:
                    n = req.num_tokens - computed
                    if 0 < self.long_prefill_token_threshold < n:
                        n = self.long_prefill_token_threshold
                    if not self.enable_chunked_prefill and n > budget:
                        break
                    n = min(n, budget)
                    if self.need_mamba_block_aligned_split:
                        n = self._mamba_block_aligned_split(req, n, local,
                                                            ext)
                    assert n > 0
                blocks = kvm.allocate_slots(
                    req, n, num_new_computed_tokens=local,
                    new_computed_blocks=comp,
                    num_external_computed_tokens=ext,
                    delay_cache_blocks=load_async)
                if blocks is None:
                    break
                if self.connector is not None:
                    given = (kvm.get_blocks(rid) if _GEN != "v0.12"
                             else comp + blocks)
                    self.connector.update_state_after_alloc(req, given, ext)
                req = self.waiting.popleft()
                if load_async:
                    skipped.append(req)
                    req.status = RequestStatus.WAITING_FOR_REMOTE_KVS
                    continue
                self.running.append(req)
                if req.status == RequestStatus.WAITING:
                    new_reqs.append(req)
                elif req.status == RequestStatus.PREEMPTED:
                    resumed_reqs.append(req)
                else:
                    raise RuntimeError(f"Invalid request status: {req.status}")
                new_blocks_of[rid] = kvm.get_blocks(rid)
                sync_loads = sync_loads or ext > 0
                num_sched[rid] = n
                budget -= n
                req.status = RequestStatus.RUNNING
                req.num_computed_tokens = computed
                if req.num_cached_tokens < 0:
                    req.num_cached_tokens = computed
            self.waiting.extendleft(reversed(skipped))

        total = sum(num_sched.values())
        assert total <= self.max_num_scheduled_tokens and budget >= 0
        new_data = [NewRequestData(r.request_id, list(r.prompt_token_ids),
                                   new_blocks_of[r.request_id].get_block_ids(),
                                   r.num_computed_tokens) for r in new_reqs]
        cached = CachedRequestData()
        for idx, r in enumerate(running_reqs + resumed_reqs):
            rid = r.request_id
            cached.req_ids.append(rid)
            prev = rid in self.prev_step_scheduled_req_ids
            if idx >= len(running_reqs):
                assert not prev
                cached.resumed_req_ids.add(rid)
            if not prev:
                cached.all_token_ids[rid] = list(r.all_token_ids)
            cached.new_block_ids.append(
                new_blocks_of[rid].get_block_ids(allow_none=True))
            cached.num_computed_tokens.append(r.num_computed_tokens)
            cached.num_output_tokens.append(r.num_output_tokens)
        self.prev_step_scheduled_req_ids = set(num_sched)
        out = SchedulerOutput(new_data, cached, num_sched, total,
                              self.finished_req_ids,
                              {r.request_id for r in preempted})
        out.has_sync_kv_loads = sync_loads and _GEN == "current"
        if self.connector is not None:
            out.kv_connector_metadata = self.connector.build_connector_meta(out)
        for rid, n in num_sched.items():            # _update_after_schedule
            self.requests[rid].num_computed_tokens += n
        self.finished_req_ids = set()
        return out

    def _mamba_block_aligned_split(self, req: Request, n: int,
                                   local: int = 0, ext: int = 0) -> int:
        """As upstream at 00f4240ee645 (external tokens counted, no
        eagle): in a prefill, @n tokens shortened so the step ends on a
        block boundary, or on the prompt's last one, where the state is
        kept; under one block, left as it is (no state kept)."""
        done = req.num_computed_tokens + local + ext
        if done < max(req.num_prompt_tokens, req.num_tokens - 1):
            p = self.kv_cache_manager.block_size
            last = req.num_tokens - req.num_tokens % p
            if done + n < last:
                if n >= p:
                    n = n // p * p
            elif done < last < done + n:
                n = last - done
        return n

    def _update_waiting_for_remote_kv(self, req: Request) -> bool:
        rid = req.request_id
        if rid not in self.finished_recving_kv_req_ids:
            return False
        kvm = self.kv_cache_manager
        if rid in self.failed_recving_kv_req_ids:
            if req.num_computed_tokens:
                kvm.cache_blocks(req, req.num_computed_tokens)
            else:
                kvm.free(req)
            self.failed_recving_kv_req_ids.remove(rid)
        else:
            # current: any number of groups (every group's table covers
            # the request's pages; 00024d314514 unpacked exactly one)
            ids = (kvm.get_block_ids(rid)[0] if _GEN == "current"
                   else self._one_group(kvm.get_block_ids(rid)))
            n = min(len(ids) * self.block_size, req.num_tokens)
            if n == req.num_tokens:
                n -= 1
            kvm.cache_blocks(req, n)
            req.num_computed_tokens = n
        self.finished_recving_kv_req_ids.remove(rid)
        return True

    # -- after the step --------------------------------------------------------

    def _requests_with_invalid_blocks(self, reqs: List[Request],
                                      invalid: Set[int]) -> Set[str]:
        affected: Set[str] = set()
        marked: Set[int] = set()
        for req in reqs:
            rid = req.request_id
            ids = self._one_group(self.kv_cache_manager.get_block_ids(rid))
            if req.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                ncomp = (req.num_computed_tokens
                         if rid in self.failed_recving_kv_req_ids
                         else len(ids) * self.block_size)
            else:
                ncomp = req.num_cached_tokens
            nblk = -(-ncomp // self.block_size)
            hit, truncated = False, False
            for idx, b in zip(range(nblk), ids):
                if b not in invalid:
                    continue
                hit = True
                if b in marked:
                    continue
                marked.add(b)
                if truncated:
                    continue
                truncated = True
                req.num_computed_tokens = idx * self.block_size
                req.num_external_computed_tokens -= \
                    ncomp - req.num_computed_tokens
            if hit:
                if not truncated:
                    req.num_computed_tokens = req.num_cached_tokens
                affected.add(rid)
        return affected

    @staticmethod
    def _one_group(groups: Any) -> List[int]:
        """Upstream's `(block_ids,) = get_block_ids(...)`: raises, as
        upstream's unpacking does, with several KV cache groups."""
        (ids,) = groups
        return ids

    def _handle_invalid_blocks(self, invalid: Set[int]) -> Set[str]:
        if self.num_groups > 1:     # current: 00f4240ee645
            raise RuntimeError(
                "A KV connector reported block-level load failures "
                "(invalid_block_ids) which is not supported for models with "
                "multiple KV cache groups. Connectors must report failed "
                "requests via KVConnectorTransferResults.failed_recving "
                "instead.")
        parked = [r for r in self.waiting
                  if r.status == RequestStatus.WAITING_FOR_REMOTE_KVS]
        async_failed = self._requests_with_invalid_blocks(parked, invalid)
        sync_failed = self._requests_with_invalid_blocks(self.running,
                                                         invalid)
        self.failed_recving_kv_req_ids |= async_failed
        return sync_failed

    def update_from_output(self, out: SchedulerOutput,
                           mro: ModelRunnerOutput) -> List[str]:
        """Apply a step's results; returns the requests that finished."""
        kvo = mro.kv_connector_output
        failed: Set[str] = set()
        if kvo is not None and kvo.invalid_block_ids:
            failed = self._handle_invalid_blocks(kvo.invalid_block_ids)
        done: List[str] = []
        stopped: List[Request] = []
        for rid, n in out.num_scheduled_tokens.items():
            assert n > 0
            if rid in failed:
                continue
            req = self.requests.get(rid)
            if req is None or req.is_finished():
                continue
            tok = mro.sampled.get(rid)
            if tok is None:
                continue                 # a prefill chunk: no output yet
            req.append_output_token_ids(tok)
            if len(req.output_token_ids) >= req.max_tokens:
                req.status = RequestStatus.FINISHED_LENGTH_CAPPED
                self._free_request(req)
                stopped.append(req)
                done.append(rid)
        for req in stopped:
            self.running.remove(req)
        if kvo is not None:
            self._update_from_kv_xfer_finished(kvo)
        return done

    def _update_from_kv_xfer_finished(self, kvo: KVConnectorOutput) -> None:
        if self.connector is not None:
            self.connector.update_connector_output(kvo)
        for rid in kvo.failed_recving or ():
            # current: a whole load failed (it is in finished_recving too);
            # the recompute policy starts the request over
            assert rid in (kvo.finished_recving or ()), \
                f"failed_recving {rid} not in finished_recving"
            req = self.requests.get(rid)
            if req is not None and \
                    req.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                req.num_computed_tokens = 0
                self.failed_recving_kv_req_ids.add(rid)
        for rid in kvo.finished_recving or ():
            assert rid in self.requests, f"finished_recving {rid}: unknown"
            req = self.requests[rid]
            if req.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                self.finished_recving_kv_req_ids.add(rid)
            else:
                assert RequestStatus.is_finished(req.status)
                self._free_blocks(req)
        for rid in kvo.finished_sending or ():
            assert rid in self.requests, f"finished_sending {rid}: unknown"
            self._free_blocks(self.requests[rid])
