//! FILE operations (stub: replaced below).
use crate::frames;
use crate::proto::{self, kind};

/// A connection's downloads and uploads in progress.
#[derive(Default)]
pub struct ConnFiles {}

pub fn op(_f: &mut ConnFiles, id: u32, _payload: &[u8], out: &mut Vec<u8>) {
    frames::encode_into(out, proto::ERROR, id, &proto::error_payload(kind::UNSUPPORTED, "not yet"));
}
pub fn data(_f: &mut ConnFiles, _id: u32, _payload: &[u8], _out: &mut Vec<u8>) {}
pub fn end(_f: &mut ConnFiles, _id: u32, _out: &mut Vec<u8>) {}
pub fn pump(_f: &mut ConnFiles, _out: &mut Vec<u8>) -> bool {
    false
}
pub fn abort(_f: &mut ConnFiles) {}
