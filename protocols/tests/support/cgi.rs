//! What the CGI/1.1 variable tests share (`cgi`, with its `front` module, `cgi_headers`,
//! `cgi_path`): the PHP and app contexts they run under, a request as the front listener
//! passes it, and reading one variable back.

use bytes::Bytes;
use corral_protocols::cgi::{
    build_cgi_vars, CgiContext, CgiError, CgiRequest, CgiVars, ScriptMode,
};
use corral_protocols::Limits;

pub const ROOT: &[u8] = b"/var/www/html";

/// Says whether an error is the expected variant.
pub type ErrCheck = fn(&CgiError) -> bool;

pub fn php_ctx() -> CgiContext {
    CgiContext {
        document_root: ROOT.to_vec(),
        mode: ScriptMode::Files {
            extensions: vec![b"php".to_vec(), b".phar".to_vec()],
            index: vec![b"index.php".to_vec()],
        },
        server_software: Bytes::from_static(b"corral/0.1.0"),
        extra_env: Vec::new(),
        allow_php_ini_params: false,
    }
}

pub fn app_ctx(mount: &[u8]) -> CgiContext {
    CgiContext {
        mode: ScriptMode::App {
            mount: mount.to_vec(),
        },
        ..php_ctx()
    }
}

pub fn request<'a>(target: &'a [u8], headers: &'a [(&'a [u8], &'a [u8])]) -> CgiRequest<'a> {
    CgiRequest {
        method: b"GET",
        target,
        protocol: b"HTTP/1.1",
        headers,
        body_length: None,
        remote_addr: b"192.0.2.7",
        remote_port: Some(51234),
        server_addr: b"198.51.100.1",
        server_port: Some(8080),
        server_name: b"example.com",
        https: false,
    }
}

pub fn build(target: &[u8], headers: &[(&[u8], &[u8])]) -> Result<CgiVars, CgiError> {
    build_cgi_vars(&request(target, headers), &php_ctx(), &Limits::DEFAULT)
}

pub fn get<'a>(vars: &'a CgiVars, name: &str) -> Option<&'a [u8]> {
    vars.get(name.as_bytes()).map(|v| &v[..])
}
