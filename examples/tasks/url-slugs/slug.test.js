"use strict";

const test = require("node:test");
const assert = require("node:assert");
const { slugify, uniqueSlug } = require("./slug");

test("words are joined by dashes", () => {
  assert.strictEqual(slugify("hello world"), "hello-world");
});

test("punctuation does not leave double dashes", () => {
  assert.strictEqual(slugify("Hello, World!"), "hello-world");
});

test("runs of spaces become one dash", () => {
  assert.strictEqual(slugify("  spaced   out  "), "spaced-out");
});

test("digits are kept", () => {
  assert.strictEqual(slugify("Rust 2024 edition"), "rust-2024-edition");
});

test("a taken slug gets a number", () => {
  const taken = new Set(["release-notes", "release-notes-2"]);
  assert.strictEqual(uniqueSlug("Release notes", taken), "release-notes-3");
});
