"""Running a recurrent model window by window, carrying its state.

A stateful VAD sees each window together with the state the previous window
left; that link is the model. The one-shot `infer` and the audio pipeline
both step through audio with this, so the state handling exists once.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from edge_agent.heads.vad import VadConfig
from edge_agent.runtime.base import CompiledModel


class StatefulVad:
    """Feeds windows to a VAD model in order and returns each window's speech probability."""

    def __init__(self, model: CompiledModel, config: VadConfig) -> None:
        self._model = model
        self._config = config
        self._state = np.zeros(model.report.inputs[config.state_in], dtype=np.float32)

    def step(self, window: npt.NDArray[np.float32]) -> float:
        """Probability of speech in `window` (context + new samples), given all before it."""
        c = self._config
        outputs = self._model.infer({c.audio_input: window[None], c.state_in: self._state})
        self._state = np.asarray(outputs[c.state_out], dtype=np.float32)
        return float(np.asarray(outputs[c.probability]).reshape(-1)[0])
