"""Where episodes run and the policy is updated: rollout pools and trainer groups, in this process or as Ray actors
(FSDP2 ranks), and the weights moved between them."""
