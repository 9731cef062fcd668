"""FlashNPC mobile_export: model bundles for mobile builds and the packaged client."""
