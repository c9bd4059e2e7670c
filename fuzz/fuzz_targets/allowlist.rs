#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| agentbox::fuzzing::allowlist(data));
