#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| agentbox::fuzzing::tls_client_hello(data));
