fn main() -> std::process::ExitCode {
    agentbox::app::main()
}
