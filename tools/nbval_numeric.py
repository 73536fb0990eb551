"""nbval, with numbers compared as numbers (a pytest plugin, loaded by the root conftest.py).

The notebooks' stored outputs are produced on one CPU and re-checked by nbval on others. Vector
kernels (torch's ATen dispatch, NumPy's SIMD loops, the BLAS library) differ between CPUs in the last
bit of a float, so a strict text comparison fails on any machine but the one that produced the
outputs: a glued ``45.57647697760837`` comes back as ``45.57647697760838``, and a table entry printed
as ``1.784`` comes back as ``1.783`` when the value sits at 1.7835.

This plugin keeps nbval and its strict mode (every output of every code cell is compared) and
replaces only the test ``reference != output`` of one output field by :func:`compare_text`, which
splits both texts into numbers and the text between them:

* the text between numbers must be equal (runs of spaces and tabs count as one space, because a
  column's padding follows the width of the number printed in it; line breaks are kept);
* integers (no decimal point, no exponent: counts, sizes, indices, seeds) must be equal;
* a number printed with a decimal point or an exponent matches when the two values are within one
  unit of the last digit printed (``1.784`` against ``1.783``: a value at a rounding boundary may be
  rounded either way by two CPUs, so truncating digits in a sanitizer could not fix this);
* a full-precision float (a repr or a glued value, 12 or more significant digits) also matches within
  a relative tolerance of :data:`REL_TOL`, far below anything a reader sees and far above the last
  bits that kernels change.

Everything else about nbval is unchanged: sanitize patterns are applied first, images are skipped as
nbval skips them, and a missing or extra output fails as before. A mismatch names the cell (nbval
reports ``Cell N``), the output field, the line and the two numbers.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import pytest

__all__ = ["REL_TOL", "Mismatch", "compare_text", "compare_outputs"]

#: Relative tolerance for full-precision floats (12 or more significant digits).
REL_TOL = 1e-9
#: A number with at least this many significant digits is a full-precision value.
FULL_PRECISION_DIGITS = 12

# A decimal number: optional sign, digits with an optional fraction (or a bare fraction), and an
# optional exponent. Not preceded by a letter, digit or dot, so "float32" and "v0.11" split the same
# way on both sides, which is all that matters: both texts are tokenised by the same rule.
_NUMBER = re.compile(
    r"(?<![\w.])[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?"
)
_BLANKS = re.compile(r"[ \t]+")


@dataclass(frozen=True)
class _Number:
    text: str
    line: int

    @property
    def value(self) -> float:
        return float(self.text)

    @property
    def is_integer(self) -> bool:
        return not any(c in self.text for c in ".eE")

    @property
    def last_digit_unit(self) -> float:
        """The value of one unit in the last digit printed (0.001 for ``1.784``, 1e-4 for ``2.5e-03``)."""
        mantissa, _, exponent = self.text.lower().partition("e")
        decimals = len(mantissa.partition(".")[2])
        return 10.0 ** (int(exponent or 0) - decimals)

    @property
    def significant_digits(self) -> int:
        mantissa = self.text.lower().partition("e")[0]
        return len(mantissa.lstrip("+-").replace(".", "").lstrip("0"))


@dataclass(frozen=True)
class Mismatch:
    """Why two outputs differ: a message for the failure report."""

    message: str

    def __str__(self) -> str:
        return self.message


def _tokenise(text: str) -> tuple[list[str], list[_Number]]:
    """Split ``text`` into the text between numbers (one more piece than numbers) and the numbers."""
    pieces: list[str] = []
    numbers: list[_Number] = []
    start = 0
    for match in _NUMBER.finditer(text):
        pieces.append(_BLANKS.sub(" ", text[start:match.start()]))
        numbers.append(_Number(match.group(), text.count("\n", 0, match.start()) + 1))
        start = match.end()
    pieces.append(_BLANKS.sub(" ", text[start:]))
    return pieces, numbers


def _numbers_match(ref: _Number, out: _Number) -> bool:
    if ref.is_integer and out.is_integer:
        return ref.text.lstrip("+") == out.text.lstrip("+")
    a, b = ref.value, out.value
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return a == b
    diff = abs(a - b)
    # One unit of the coarser of the two printed precisions, with a little room for the binary
    # representation of the decimal strings themselves.
    unit = max(ref.last_digit_unit, out.last_digit_unit)
    if diff <= unit * (1 + 1e-6):
        return True
    full = min(ref.significant_digits, out.significant_digits) >= FULL_PRECISION_DIGITS
    return full and diff <= REL_TOL * max(abs(a), abs(b))


def _first_difference(a: str, b: str) -> str:
    i = next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return f"{a[max(0, i - 30):i + 30]!r} against {b[max(0, i - 30):i + 30]!r}"


def compare_text(reference: str, output: str) -> Mismatch | None:
    """Compare a stored output with a new one, numbers as numbers (see the module docstring).

    Returns ``None`` when they match, else a :class:`Mismatch` that says where and why.

    >>> compare_text("KL = 1.784 nats", "KL = 1.783 nats") is None
    True
    >>> print(compare_text("KL = 1.784 nats", "KL = 1.802 nats"))  # doctest: +NORMALIZE_WHITESPACE
    number 1 on line 1 differs: stored 1.784, got 1.802
    (|difference| 0.018 is more than one unit of the last printed digit, 0.001)
    """
    ref_pieces, ref_numbers = _tokenise(reference)
    out_pieces, out_numbers = _tokenise(output)
    if len(ref_numbers) != len(out_numbers):
        ref_lines, out_lines = reference.count("\n"), output.count("\n")
        extra = f"; {ref_lines + 1} lines stored, {out_lines + 1} lines now" if ref_lines != out_lines else ""
        return Mismatch(
            f"the output has {len(out_numbers)} numbers where the stored one has {len(ref_numbers)}"
            f"{extra}: {_first_difference(reference, output)}"
        )
    for k, (ref_piece, out_piece) in enumerate(zip(ref_pieces, out_pieces, strict=True)):
        if ref_piece != out_piece:
            line = ref_numbers[k - 1].line if k else 1
            return Mismatch(
                f"the text around the numbers differs near line {line}: "
                f"{_first_difference(ref_piece, out_piece)}"
            )
    for k, (ref, out) in enumerate(zip(ref_numbers, out_numbers, strict=True), start=1):
        if not _numbers_match(ref, out):
            if ref.is_integer and out.is_integer:
                why = "integers must be equal"
            else:
                unit = max(ref.last_digit_unit, out.last_digit_unit)
                diff = abs(ref.value - out.value)
                why = f"|difference| {diff:.3g} is more than one unit of the last printed digit, {unit:.3g}"
                if min(ref.significant_digits, out.significant_digits) >= FULL_PRECISION_DIGITS:
                    rel = diff / max(abs(ref.value), abs(out.value))
                    why += f", and the relative difference {rel:.3g} is more than {REL_TOL:g}"
            where = f"number {k} on line {ref.line}"
            return Mismatch(f"{where} differs: stored {ref.text}, got {out.text} ({why})")
    return None


def _compare_values(reference: object, output: object, where: str = "") -> Mismatch | None:
    """Texts as :func:`compare_text`; JSON outputs (dicts, lists) item by item, floats within REL_TOL."""
    if isinstance(reference, str) and isinstance(output, str):
        mismatch = compare_text(reference, output)
        return Mismatch(f"{where}{mismatch}") if mismatch and where else mismatch
    if isinstance(reference, dict) and isinstance(output, dict):
        if reference.keys() != output.keys():
            return Mismatch(f"{where}keys {sorted(reference)} stored, {sorted(output)} now")
        for key in reference:
            mismatch = _compare_values(reference[key], output[key], f"{where}[{key!r}] ")
            if mismatch:
                return mismatch
        return None
    if isinstance(reference, list) and isinstance(output, list):
        if len(reference) != len(output):
            return Mismatch(f"{where}{len(reference)} items stored, {len(output)} now")
        for k, (a, b) in enumerate(zip(reference, output, strict=True)):
            mismatch = _compare_values(a, b, f"{where}[{k}] ")
            if mismatch:
                return mismatch
        return None
    if isinstance(reference, float) and isinstance(output, float) and not isinstance(reference, bool):
        if reference == output or abs(reference - output) <= REL_TOL * max(abs(reference), abs(output)):
            return None
    elif reference == output and type(reference) is type(output):
        return None
    return Mismatch(f"{where}stored {reference!r}, got {output!r}")


def _flatten(outputs: Iterable[Mapping], skip: Iterable[str], sanitize) -> dict[str, list]:
    """nbval's layout: output field (MIME type of ``data`` flattened in) -> its values, in order."""
    skip = set(skip)
    flat: dict[str, list] = defaultdict(list)
    for output in outputs:
        for key, value in output.items():
            if key in skip:
                continue
            if key == "data":
                for mime, data in value.items():
                    if mime not in skip:
                        flat[mime].append(sanitize(data))
            else:
                flat[key].append(sanitize(value))
    return flat


def compare_outputs(cell, test, ref, skip_compare=None) -> bool:
    """Replacement for ``nbval.plugin.IPyNbCell.compare_outputs`` (same signature and contract).

    It fills ``cell.comparison_traceback`` (which nbval prints under "Cell N") and returns whether
    the outputs match.
    """
    from nbval.plugin import transform_streams_for_comparison

    skip = skip_compare or cell.parent.skip_compare
    reference = _flatten(transform_streams_for_comparison(ref), skip, cell.sanitize)
    testing = _flatten(transform_streams_for_comparison(test), skip, cell.sanitize)
    cell.comparison_traceback = []
    report = cell.comparison_traceback.append

    missing, unexpected = set(reference) - set(testing), set(testing) - set(reference)
    if missing or unexpected:
        if missing:
            report(f"Missing output fields from running code: {sorted(missing)}")
        if unexpected:
            report(f"Unexpected output fields from running code: {sorted(unexpected)}")
        return False
    for key, ref_values in reference.items():
        test_values = testing[key]
        if len(test_values) != len(ref_values):
            report(f"'{key}': {len(ref_values)} outputs stored, {len(test_values)} now")
            return False
        for index, (ref_value, test_value) in enumerate(zip(ref_values, test_values, strict=True)):
            mismatch = _compare_values(ref_value, test_value)
            if mismatch is not None:
                which = f" (output {index + 1} of {len(ref_values)})" if len(ref_values) > 1 else ""
                report(f"mismatch in '{key}'{which}: {mismatch}")
                return False
    return True


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("nbval").addoption(
        "--nbval-exact-text",
        action="store_true",
        help="compare notebook outputs as exact text (nbval's own comparison) instead of numbers as numbers",
    )


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--nbval-exact-text", default=False):
        return
    if not config.pluginmanager.hasplugin("nbval"):
        return
    from nbval.plugin import IPyNbCell

    IPyNbCell.compare_outputs = compare_outputs
