fn main() {
    println!("env: {:?}", option_env!("CARGO_BIN_EXE_tenure"));
    println!("exe: {:?}", std::env::current_exe());
    println!("tmpdir: {:?}", option_env!("CARGO_TARGET_TMPDIR"));
}
