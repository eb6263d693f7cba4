// libtorch's directory on this program's rpath, so it starts without LD_LIBRARY_PATH.
fn main() {
    if let Ok(dir) = std::env::var("DEP_DLBRIDGE_LIBTORCH_DIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    }
}
