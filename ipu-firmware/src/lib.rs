//! The collective engine that runs in the provider's trusted domain (DPU/IPU), also used in-process by
//! the testbed's emulated training job.
