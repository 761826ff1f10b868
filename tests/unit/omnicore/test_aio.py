"""``omnicore.aio.cancel_and_wait``: a background loop that absorbs a cancel still ends."""

from __future__ import annotations

import asyncio

from omnicore.aio import cancel_and_wait


async def test_a_loop_that_absorbs_a_cancel_is_cancelled_again_until_it_ends() -> None:
    absorbed = 0

    async def loop() -> None:
        nonlocal absorbed
        while True:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                if absorbed == 0:  # as a read whose timeout fired with the cancel answers None
                    absorbed += 1
                    continue
                raise

    task = asyncio.create_task(loop())
    await asyncio.sleep(0)
    await asyncio.wait_for(cancel_and_wait(task, every_s=0.01), 5)
    assert task.cancelled() and absorbed == 1


async def test_a_loop_that_failed_is_waited_for_without_raising() -> None:
    async def fails() -> None:
        raise RuntimeError("boom")

    task = asyncio.create_task(fails())
    await asyncio.sleep(0)
    await cancel_and_wait(task)  # its failure is its own to log; stopping it does not raise
    assert isinstance(task.exception(), RuntimeError)
