#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| agentbox::fuzzing::text_protocol(data));
