"use strict";

// URL slugs for article titles: "Hello, World!" becomes "hello-world".

// Letters and digits are kept; everything else becomes a dash.
function slugify(title) {
  return title
    .toLowerCase()
    .replace(/[^a-z0-9]/g, "-")
    .replace(/^-+|-+$/g, "");
}

// A slug not yet in `taken`: "post", then "post-2", "post-3", ...
function uniqueSlug(title, taken) {
  const base = slugify(title);
  let slug = base;
  for (let n = 2; taken.has(slug); n++) {
    slug = `${base}-${n}`;
  }
  return slug;
}

module.exports = { slugify, uniqueSlug };
