//! Greedy word wrapping for terminal output.

/// Splits `text` into lines of at most `width` characters, breaking only between words.
/// A word longer than `width` gets a line of its own.
pub fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        if line.is_empty() {
            line.push_str(word);
        } else if line.len() + 1 + word.len() <= width + 1 {
            line.push(' ');
            line.push_str(word);
        } else {
            lines.push(std::mem::take(&mut line));
            line.push_str(word);
        }
    }
    if !line.is_empty() {
        lines.push(line);
    }
    lines
}

/// The wrapped text as one string, one line per row.
pub fn fill(text: &str, width: usize) -> String {
    wrap(text, width).join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_text_stays_on_one_line() {
        assert_eq!(wrap("a b c", 10), ["a b c"]);
    }

    #[test]
    fn a_line_of_exactly_the_width_fits() {
        assert_eq!(wrap("ab cd", 5), ["ab cd"]);
    }

    #[test]
    fn breaks_before_the_word_that_does_not_fit() {
        assert_eq!(wrap("ab cd ef", 4), ["ab", "cd", "ef"]);
    }

    #[test]
    fn no_line_is_longer_than_the_width() {
        let text = "one two three four five six seven";
        for line in wrap(text, 8) {
            assert!(line.len() <= 8, "{line:?} is longer than 8");
        }
    }

    #[test]
    fn a_long_word_gets_a_line_of_its_own() {
        assert_eq!(wrap("a abcdefgh b", 4), ["a", "abcdefgh", "b"]);
    }

    #[test]
    fn fill_joins_the_lines() {
        assert_eq!(fill("", 5), "");
        assert_eq!(fill("to be or not", 6), "to be\nor not");
    }
}
