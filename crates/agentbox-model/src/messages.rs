//! Other programs' messages the model layer must recognise by their words (a server's error
//! with no code of its own to tell it by). They are matched here and nowhere else, each tested
//! against the message as that server printed it, with its version.

/// The server generated a reply but could not parse the model's tool call out of it:
/// llama.cpp's server says so (with status 500), whatever the model wrote.
pub(crate) fn unparsable_tool_call(message: &str) -> bool {
    message.contains("Failed to parse tool call")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_servers_words_are_recognised_as_it_printed_them() {
        // llama.cpp's server as the local model runs it (xllamacpp 0.2.14, scripts/local-model).
        assert!(unparsable_tool_call(
            "Failed to parse tool call arguments as JSON: [json.exception.parse_error.101] parse \
             error at line 1, column 90: syntax error while parsing value - invalid string: missing \
             closing quote"
        ));
        assert!(!unparsable_tool_call("the request exceeds the context size"));
    }
}
