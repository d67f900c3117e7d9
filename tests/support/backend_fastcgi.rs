//! What the FastCGI backend-exchange tests share (`tests/backend_fastcgi.rs` against real
//! peers, `tests/backend_fastcgi_faults.rs` against fake ones): the exchange's options with
//! its timeouts, a backend's address, and reading a response body whole.

use std::path::Path;
use std::time::Duration;

use corral::backend::{BackendResponse, ExchangeOptions, Timeouts};
use corral::config::BackendAddress;

/// Options of pool `php`, request 7: 5 s to connect, 20 s to the first byte, 60 s in all.
pub fn options() -> ExchangeOptions {
    let mut options = ExchangeOptions::new("php", 7);
    options.timeouts = Timeouts {
        connect: Duration::from_secs(5),
        first_byte: Duration::from_secs(20),
        request: Duration::from_secs(60),
    };
    options
}

/// The Unix socket `socket` as a backend address.
pub fn address(socket: &Path) -> BackendAddress {
    BackendAddress::Unix(socket.to_path_buf())
}

/// Reads the whole body, checking that no chunk is larger than a FastCGI record.
pub async fn read_all(response: &mut BackendResponse) -> Vec<u8> {
    let mut all = Vec::new();
    while let Some(chunk) = response.body.next_chunk().await {
        let chunk = chunk.unwrap();
        assert!(chunk.len() <= 65535, "chunk of {} bytes", chunk.len());
        all.extend_from_slice(&chunk);
    }
    assert!(response.body.is_ended());
    all
}
