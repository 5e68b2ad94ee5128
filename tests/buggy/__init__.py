"""A catalogue of realistic buggy implementations, one small piece of code per mistake.

Each entry is ``(target, name, implementation, expected_phrase)``: the checker
``check_<target>`` must reject ``implementation``, and when ``expected_phrase``
is not None its report must contain that phrase (the named mistake). Every
implementation's docstring says what is wrong with it.
"""

from . import attention, ffn_positional, gpt, masking, multihead, norms, sampling, transformer

CATALOGUE = [
    *attention.CATALOGUE,
    *masking.CATALOGUE,
    *multihead.CATALOGUE,
    *norms.CATALOGUE,
    *ffn_positional.CATALOGUE,
    *transformer.CATALOGUE,
    *sampling.CATALOGUE,
    *gpt.CATALOGUE,
]
