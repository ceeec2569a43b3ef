"""Errors of the torchrun engine."""

from __future__ import annotations

from phalanx.errors import PhalanxError


class WorkersLostError(PhalanxError, RuntimeError):
    """More workers were missing in a round than the configured ``f`` allows (or a serverless collective failed).

    A checkpoint of the state at the start of the failed round was written first (when the run has a directory), so
    the same command, started again once the workers are back, resumes from it.
    """

    def __init__(
        self, round: int, missing: list[int], f: int, round_timeout: float, checkpoint: str | None,
        detail: str = "",
    ) -> None:
        self.round = round
        self.missing = missing
        self.f = f
        self.round_timeout = round_timeout
        self.checkpoint = checkpoint
        if missing:
            ranks = ", ".join(str(r) for r in missing)
            msg = (
                f"round {round}: {len(missing)} worker(s) missing (ranks {ranks}) after waiting "
                f"round_timeout={round_timeout:g} s, more than f={f} the aggregator tolerates"
            )
        else:
            msg = f"round {round}: a rank failed or stayed silent longer than round_timeout={round_timeout:g} s"
        if detail:
            msg += f" — {detail}"
        msg += (
            f"; checkpoint written to {checkpoint}: start the same command again to resume"
            if checkpoint else "; no run directory, nothing saved"
        )
        super().__init__(msg)


class TransportError(PhalanxError, RuntimeError):
    """The ranks could not connect (the store or the process group); nothing was trained."""
