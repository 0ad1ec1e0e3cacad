"""What a rank does when the job around it is asked to stop: the launcher's or the scheduler's signals
(SIGUSR1/USR2/TERM, Ctrl-C or its local forward) set a flag that the training loop reads at its next
synchronisation point, and whether the job asks to be requeued. Apart from the loop because it reads the
launcher's environment and signals (this layer's knowledge), not the training state."""

from __future__ import annotations

import os
import signal

from wagma_bench.runtime.signals import take_early
from wagma_bench.runtime.slurm import EXIT_SIGNALS, FORWARDED_INTERRUPT, INTERRUPT_SIGNALS, REQUEUE_SIGNALS
from wagma_bench.runtime.supervise import LAUNCHER_DIR_ENV, launcher_interrupts, launcher_stop


class Preemption:
    """SIGUSR1 / SIGUSR2 / SIGTERM / SIGINT set a flag; the loop saves a checkpoint at the next
    synchronisation point and stops.

    After a requeue signal (USR1: our sbatch scripts' warning before the time limit; USR2: submitit's) rank 0
    then requeues the job; after TERM the run just ends (see :mod:`wagma_bench.runtime.slurm` for which signal
    reaches whom). Ctrl-C (SIGINT, or the local launcher's forward of it) ends the run as ``interrupted``; a
    second Ctrl-C raises KeyboardInterrupt at once (the run's end is still recorded). A SIGINT that the
    launching process set to be ignored stays ignored: that launcher forwards Ctrl-C itself.
    """

    def __init__(self):
        self.signal: int | None = None
        self.interrupts = 0
        self.launcher_dir = os.environ.get(
            LAUNCHER_DIR_ENV
        )  # a local launcher's: it counts its Ctrl-Cs there
        for sig in (*REQUEUE_SIGNALS, *EXIT_SIGNALS, *INTERRUPT_SIGNALS, FORWARDED_INTERRUPT):
            try:
                if sig in INTERRUPT_SIGNALS and signal.getsignal(sig) == signal.SIG_IGN:
                    continue  # the local launcher's ranks: it forwards Ctrl-C as FORWARDED_INTERRUPT
                signal.signal(sig, self._handle)
            except ValueError:  # not the main thread (tests)
                pass
        # what came while this rank started, before it listened: signals it noted
        # (signals.rank_listening_later), a SIGTERM or SIGHUP its launcher took before the rank existed, a
        # Ctrl-C whose forward it ignored
        for sig in take_early():
            self._handle(sig, None)
        if launcher_stop(self.launcher_dir) is not None:
            self._handle(signal.SIGTERM, None)
        if launcher_interrupts(self.launcher_dir):
            self._handle(FORWARDED_INTERRUPT, None)

    def _handle(self, signum, frame):
        if signum in (*INTERRUPT_SIGNALS, FORWARDED_INTERRUPT):
            # the launcher's count where it keeps one: a forward that came twice, or not at all, counts right
            counted = launcher_interrupts(self.launcher_dir) if signum == FORWARDED_INTERRUPT else 0
            self.interrupts = max(self.interrupts + (counted == 0), counted)
            if self.interrupts > 1:
                raise KeyboardInterrupt("stopped at once by a second Ctrl-C")
        self.signal = signum

    @property
    def requeue(self) -> bool:
        return self.signal in REQUEUE_SIGNALS
