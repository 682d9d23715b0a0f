//! ApiVersions: the table in [`super::versions`], and in a cluster the
//! feature levels of its metadata image (what `kafka-features describe`
//! shows).

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::api_versions_response::{ApiVersion, FinalizedFeatureKey, SupportedFeatureKey};
use kafka_protocol::messages::{ApiVersionsRequest, ApiVersionsResponse};

use super::versions::{advertised, FEATURES};
use super::{str_bytes, RequestContext};

fn api_keys(cluster: bool) -> Vec<ApiVersion> {
    advertised(cluster)
        .map(|(key, lo, hi)| {
            ApiVersion::default().with_api_key(*key as i16).with_min_version(*lo).with_max_version(*hi)
        })
        .collect()
}

pub fn handle(ctx: &RequestContext, _req: ApiVersionsRequest) -> ApiVersionsResponse {
    let Some(cluster) = ctx.state.cluster() else {
        return ApiVersionsResponse::default().with_error_code(0).with_api_keys(api_keys(false));
    };
    // Features exist from v3 on; the encoder skips them for older versions.
    let image = cluster.image();
    let supported = FEATURES
        .iter()
        .map(|(name, level)| {
            SupportedFeatureKey::default().with_name(str_bytes(name)).with_min_version(*level).with_max_version(*level)
        })
        .collect();
    let finalized = image
        .features
        .iter()
        .map(|(name, level)| {
            FinalizedFeatureKey::default()
                .with_name(str_bytes(name))
                .with_min_version_level(*level)
                .with_max_version_level(*level)
        })
        .collect();
    ApiVersionsResponse::default()
        .with_error_code(0)
        .with_api_keys(api_keys(true))
        .with_supported_features(supported)
        // Kafka's epoch for finalized features is the metadata offset they were read at.
        .with_finalized_features_epoch(image.offset as i64)
        .with_finalized_features(finalized)
}

/// The v0 answer to an ApiVersions request at a version we do not know (KIP-511).
pub fn unsupported_version_response(cluster: bool) -> ApiVersionsResponse {
    ApiVersionsResponse::default()
        .with_error_code(ResponseError::UnsupportedVersion.code())
        .with_api_keys(api_keys(cluster))
}
