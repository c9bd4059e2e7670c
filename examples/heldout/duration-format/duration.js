"use strict";

// Human-readable durations for a job runner's log: 3725 seconds is "1 hour, 2 minutes, 5 seconds".

const UNITS = [
  ["day", 86400],
  ["hour", 360],
  ["minute", 60],
  ["second", 1],
];

function plural(n, unit) {
  return `${n} ${unit}${n > 1 ? "s" : ""}`;
}

// The largest units first; units that are zero are left out, except "0 seconds" for 0.
function formatDuration(seconds) {
  if (!Number.isInteger(seconds) || seconds < 0) {
    throw new RangeError(`not a duration: ${seconds}`);
  }
  const parts = [];
  let left = seconds;
  for (const [unit, size] of UNITS) {
    const n = Math.floor(left / size);
    left -= n * size;
    if (n > 0) parts.push(plural(n, unit));
  }
  return parts.length ? parts.join(", ") : plural(0, "second");
}

// The same, with at most `count` parts: the rest is dropped, not rounded.
function shortDuration(seconds, count = 2) {
  return formatDuration(seconds).split(", ").slice(0, count).join(", ");
}

module.exports = { formatDuration, shortDuration };
