"""Lightning training jobs (pretrain, finetune, bench): built in the policy issue."""
