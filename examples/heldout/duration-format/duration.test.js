"use strict";

const test = require("node:test");
const assert = require("node:assert");
const { formatDuration, shortDuration } = require("./duration");

test("seconds only", () => {
  assert.strictEqual(formatDuration(45), "45 seconds");
  assert.strictEqual(formatDuration(1), "1 second");
});

test("zero is 0 seconds", () => {
  assert.strictEqual(formatDuration(0), "0 seconds");
});

test("hours, minutes and seconds", () => {
  assert.strictEqual(formatDuration(3725), "1 hour, 2 minutes, 5 seconds");
});

test("days", () => {
  assert.strictEqual(formatDuration(2 * 86400 + 7200), "2 days, 2 hours");
});

test("short form keeps the largest parts", () => {
  assert.strictEqual(shortDuration(3725), "1 hour, 2 minutes");
});

test("negative durations are refused", () => {
  assert.throws(() => formatDuration(-1), RangeError);
});
