"""Hopper GEMM main loop: the TMA producer, the wgmma consumers and the pipeline between them.

* Pipeline: PipelineTmaAsync with `stages` slots; per slot one "full" mbarrier (TMA transaction
  bytes = A tile + B tile bytes) and one "empty" mbarrier (one arrive per consumer warp per CTA
  that multicasts into this slot).
* Producer (one elected thread of the producer warpgroup's warp 0): for every tile the
  scheduler walks, producer_acquire (wait empty, arm full with the byte count) -> TMA A tile,
  TMA B tile on the full barrier (multicast within the cluster where the masks say so) ->
  advance; then producer_tail, so no TMA write is in flight when the CTA exits.
* Consumers: consumer_wait (full) -> warpgroup.fence -> 4 wgmma k-steps -> commit_group; the
  slot of the previous k-tile is released only after wait_group(1) shows its wgmma finished
  (one batch in flight, so TMA writes never race the tensor cores' reads). fp8 promotion: each
  k-tile into a zeroed second accumulator set, added in fp32 after wait_group(0).
* Ping-pong: warpgroup `owner` takes every other tile of the walk; the producer loads them all,
  so a warpgroup's pipeline states skip the other's k-tiles. The main loops take turns on named
  barriers MAIN_LOOP_TURN + g, which keeps the parity waits exact (a slot's "full" barrier is
  waited on only after every earlier use of that slot was), and lets one warpgroup's epilogue
  run under the other's wgmmas.
* After a tile's last wgmma: griddepcontrol.launch_dependents (PDL), then the epilogue
  strategy's store_tile (epilogue.py).
"""

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline

from cute_aot.kernels.gemm_sm90.resources import WARPGROUP

__all__ = ["MAIN_LOOP_TURN", "Mainloop"]

# Ping-pong: "warpgroup g may start its main loop" is named barrier MAIN_LOOP_TURN + g (bar.sync
# by g, bar.arrive by the other); the epilogue's are EPILOGUE_BARRIER + g (1, 2).
MAIN_LOOP_TURN = 3


class Mainloop:
    """TMA -> shared-memory slots -> wgmma, for every tile the scheduler gives this CTA."""

    def __init__(
        self,
        ab_dtype: type[cutlass.Numeric],
        acc_dtype: type[cutlass.Numeric],
        tile_shape_mnk: tuple[int, int, int],
        cluster_mn: tuple[int, int],
        stages: int,
        tile_threads: int,
        tile_owners: int,
        promote: bool,
        pingpong: bool,
        pdl: bool,
        scheduler,
        epilogue,
    ):
        self.ab_dtype = ab_dtype
        self.acc_dtype = acc_dtype
        self.tile_shape_mnk = tile_shape_mnk
        self.cluster_mn = cluster_mn
        self.stages = stages
        self.tile_threads = tile_threads  # consumers of one tile: one "empty" arrive per warp
        self.tile_owners = tile_owners  # 2 for ping-pong
        self.promote = promote
        self.pingpong = pingpong
        self.pdl = pdl
        self.scheduler = scheduler  # scheduler.py: which tiles
        self.epilogue = epilogue  # epilogue.py: what becomes of a tile's accumulators

    @cute.jit
    def make_pipeline(self, storage, a_smem, b_smem, cta_layout_mnk):
        """The slots' full/empty mbarriers in shared memory; initialised without a sync (the
        kernel's pipeline_init_arrive/wait is it)."""
        a_stage_layout = cute.slice_(a_smem, (None, None, 0))
        b_stage_layout = cute.slice_(b_smem, (None, None, 0))
        tx_bytes = cute.size_in_bytes(self.ab_dtype, a_stage_layout) + cute.size_in_bytes(
            self.ab_dtype, b_stage_layout
        )
        return pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.pipeline_barriers.data_ptr(),
            num_stages=self.stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, self.tile_threads),
            tx_count=tx_bytes,
            cta_layout_vmnk=cute.make_layout((1, *cta_layout_mnk.shape)),
            enable_multicast_signaling=True,
            defer_sync=True,
        )

    @cute.jit
    def produce(
        self,
        tma_a,
        mA,
        tma_b,
        mB,
        sA,
        sB,
        main_pipe,
        cta_layout_mnk,
        cluster_coord,
        masks,
        walk,
        clusters,
        k_range,
    ):
        """The producer warp: for every tile this CTA walks, TMA-load its k-tiles of A and B
        into the pipeline's slots (multicast within the cluster where masks say so)."""
        first, end, step = walk
        k_begin, k_tiles = k_range
        # Per operand: its TMA atom, shared and global tensors, which tile coordinates index
        # it, and the CTAs it is multicast to (the others along the cluster's M or N).
        operands = (
            (tma_a, sA, mA, (1, None, 1), cluster_coord[1], (0, None, 0), masks[0]),
            (tma_b, sB, mB, (None, 1, 1), cluster_coord[0], (None, 0, 0), masks[1]),
        )
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
        for linear in cutlass.range(first, end, step, unroll=1):
            tile_coord = (*self.scheduler.tile_of(linear, *clusters), None)
            loads = []
            for tma, smem, gmem, proj, peer, peers, mask in operands:
                tile = cute.local_tile(gmem, self.tile_shape_mnk, tile_coord, proj=proj)
                to_smem, from_gmem = cute.nvgpu.cpasync.tma_partition(
                    tma,
                    peer,
                    cute.make_layout(cute.slice_(cta_layout_mnk, peers).shape),
                    cute.group_modes(smem, 0, 2),
                    cute.group_modes(tile, 0, 2),
                )
                loads.append((tma, from_gmem, to_smem, mask))
            for k_tile in cutlass.range(k_begin, k_begin + k_tiles, unroll=1):
                main_pipe.producer_acquire(state)
                full = main_pipe.producer_get_barrier(state)
                for tma, from_gmem, to_smem, mask in loads:
                    cute.copy(
                        tma,
                        from_gmem[(None, k_tile)],
                        to_smem[(None, state.index)],
                        tma_bar_ptr=full,
                        mcast_mask=mask,
                    )
                main_pipe.producer_commit(state)
                state.advance()
        if cutlass.const_expr(self.pdl):
            cute.arch.griddepcontrol_launch_dependents()
        # Wait until the consumers released every slot: no TMA write is still in flight into
        # this CTA (or a peer) when the CTA exits.
        main_pipe.producer_tail(state)

    @cute.jit
    def consume(
        self,
        tiled_mma,
        sA,
        sB,
        storage,
        main_pipe,
        mXScale,
        mWScale,
        mBias,
        mOut,
        tidx,
        split,
        walk,
        clusters,
        k_tiles,
        owner,
        tma_epilogue,
    ):
        """The consumer warpgroups: for every tile this CTA walks, the wgmma main loop over the
        pipeline's slots into fp32 accumulators, then the epilogue. Ping-pong: warpgroup
        `owner` takes every other tile (the producer loads them all in walk order), its
        main loop in turn with the other's, so one's epilogue runs under the other's wgmma."""
        first, end, step = walk
        thr_mma = tiled_mma.get_slice(tidx)
        tCrA = tiled_mma.make_fragment_A(thr_mma.partition_A(sA))
        tCrB = tiled_mma.make_fragment_B(thr_mma.partition_B(sB))
        acc = cute.make_rmem_tensor(
            thr_mma.partition_shape_C(self.tile_shape_mnk[:2]), self.acc_dtype
        )
        part = None
        if cutlass.const_expr(self.promote):
            part = cute.make_rmem_tensor(acc.shape, self.acc_dtype)
        read = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        release = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, True)
        scale, staging, sBias = self.epilogue.prepare(storage, owner, mXScale, mWScale)
        tile_step = step * self.tile_owners
        if cutlass.const_expr(self.pingpong):
            # Skip the k-tiles of the other warpgroup's tile before this one's first.
            read.advance(owner * k_tiles)
            release.advance(owner * k_tiles)
        for linear in cutlass.range(first + owner * step, end, tile_step, unroll=1):
            tile = self.scheduler.tile_of(linear, *clusters)
            if cutlass.const_expr(self.epilogue.prefetch_bias):
                # sBias is free: the previous tile's _stage finished before its second barrier.
                self.epilogue.fetch_bias(mBias, sBias, tile, tidx)
            if cutlass.const_expr(self.pingpong):
                # Wait for the other warpgroup's main loop of the tile before this one: only
                # then can this one's slots' phases not be mistaken for its.
                if linear != first:
                    cute.arch.barrier(
                        barrier_id=MAIN_LOOP_TURN + owner, number_of_threads=2 * WARPGROUP
                    )
            acc.fill(0.0)
            if cutlass.const_expr(self.promote):
                # Each k-tile into a zeroed second set, then added in full fp32.
                for _ in cutlass.range(k_tiles, unroll=1):
                    main_pipe.consumer_wait(read)
                    part.fill(0.0)
                    self.mma_k_tile(tiled_mma, part, tCrA, tCrB, read.index)
                    cute.nvgpu.warpgroup.wait_group(0)
                    main_pipe.consumer_release(read)
                    read.advance()
                    for i in cutlass.range(cute.size(acc), unroll_full=True):
                        acc[i] = acc[i] + part[i]
                self.pass_turn(owner, linear, step, end)
            else:
                for k_tile in cutlass.range(k_tiles, unroll=1):
                    main_pipe.consumer_wait(read)
                    self.mma_k_tile(tiled_mma, acc, tCrA, tCrB, read.index)
                    # Keep one wgmma batch in flight; the batch before it has now finished
                    # reading its slot, which may be refilled.
                    cute.nvgpu.warpgroup.wait_group(1)
                    if k_tile > 0:
                        main_pipe.consumer_release(release)
                        release.advance()
                    read.advance()
                self.pass_turn(owner, linear, step, end)
                cute.nvgpu.warpgroup.wait_group(0)
                if k_tiles > 0:
                    main_pipe.consumer_release(release)
                    release.advance()
            if cutlass.const_expr(self.pingpong):
                read.advance(k_tiles)  # the other warpgroup's next tile
                release.advance(k_tiles)
            if cutlass.const_expr(self.pdl):
                cute.arch.griddepcontrol_launch_dependents()
            self.epilogue.store_tile(
                acc,
                scale,
                tiled_mma,
                thr_mma,
                staging,
                mBias,
                sBias,
                mOut,
                tma_epilogue,
                tile,
                tidx,
                split,
                owner,
                (linear, first, tile_step),
            )
        self.epilogue.finish(tidx)

    @cute.jit
    def pass_turn(self, owner, linear, step, end):
        """Ping-pong: every wgmma of this tile is issued; the other warpgroup, if it has a
        next tile (linear + step), may start its main loop."""
        if cutlass.const_expr(self.pingpong):
            if linear + step < end:
                cute.arch.barrier_arrive(
                    barrier_id=MAIN_LOOP_TURN + 1 - owner, number_of_threads=2 * WARPGROUP
                )

    @cute.jit
    def mma_k_tile(self, tiled_mma, into, tCrA, tCrB, slot_index):
        """One k-tile's wgmmas from pipeline slot `slot_index` into `into`, as one committed
        batch (the caller decides how long to let it run)."""
        cute.nvgpu.warpgroup.fence()
        for k_block in cutlass.range_constexpr(cute.size(tCrA, mode=[2])):
            slot = (None, None, k_block, slot_index)
            cute.gemm(tiled_mma, into, tCrA[slot], tCrB[slot], into)
        cute.nvgpu.warpgroup.commit_group()
