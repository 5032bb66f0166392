//! The `Election` custom resource (`tenure.dev/v1alpha1`) and the opt-in status publisher.
