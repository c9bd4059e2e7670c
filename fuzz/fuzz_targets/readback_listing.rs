#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| agentbox::fuzzing::readback_listing(data));
