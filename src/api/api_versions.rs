//! ApiVersions: the table in [`super::versions`], nothing else.

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::{ApiVersionsRequest, ApiVersionsResponse};

use super::versions::SUPPORTED;
use super::RequestContext;

fn api_keys() -> Vec<ApiVersion> {
    SUPPORTED
        .iter()
        .map(|(key, lo, hi)| {
            ApiVersion::default().with_api_key(*key as i16).with_min_version(*lo).with_max_version(*hi)
        })
        .collect()
}

pub fn handle(_ctx: &RequestContext, _req: ApiVersionsRequest) -> ApiVersionsResponse {
    ApiVersionsResponse::default().with_error_code(0).with_api_keys(api_keys())
}

/// The v0 answer to an ApiVersions request at a version we do not know (KIP-511).
pub fn unsupported_version_response() -> ApiVersionsResponse {
    ApiVersionsResponse::default().with_error_code(ResponseError::UnsupportedVersion.code()).with_api_keys(api_keys())
}
