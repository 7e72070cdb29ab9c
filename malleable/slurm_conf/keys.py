"""Names of the settings Slurm accepts, for the ``keys`` check (a misspelt key stops slurmctld).

``SLURM_CONF_KEYS`` are the top-level slurm.conf parameters of Slurm 22.05
(the PARAMETERS section of its slurm.conf(5)), plus settings added by later
releases up to 25.11 as far as they are known here. When a controller
answers, the keys ``scontrol show config`` prints are accepted as well, so a
newer Slurm's own keys are recognised even when missing from this list.
Record keys (NodeName, PartitionName, ...) are not top-level settings and are
handled by the parser.
"""

from __future__ import annotations

SLURM_CONF_KEYS: frozenset[str] = frozenset(k.lower() for k in (
    "AccountingStorageBackupHost", "AccountingStorageEnforce",
    "AccountingStorageExternalHost", "AccountingStorageHost", "AccountingStorageParameters",
    "AccountingStoragePass", "AccountingStoragePort", "AccountingStorageTRES",
    "AccountingStorageType", "AccountingStorageUser", "AccountingStoreFlags",
    "AcctGatherEnergyType", "AcctGatherFilesystemType", "AcctGatherInterconnectType",
    "AcctGatherNodeFreq", "AcctGatherProfileType", "AllowSpecResourcesUsage",
    "AuthAltParameters", "AuthAltTypes", "AuthInfo", "AuthType", "BackupAddr",
    "BackupController", "BatchStartTimeout", "BcastExclude", "BcastParameters",
    "BurstBufferType", "CliFilterPlugins", "ClusterName", "CommunicationParameters",
    "CompleteWait", "ControlAddr", "ControlMachine", "CoreSpecPlugin", "CpuFreqDef",
    "CpuFreqGovernors", "CredType", "DebugFlags", "DefCpuPerGPU", "DefMemPerCPU",
    "DefMemPerGPU", "DefMemPerNode", "DependencyParameters", "DisableRootJobs",
    "EioTimeout", "EnforcePartLimits", "Epilog", "EpilogMsgTime", "EpilogSlurmctld",
    "ExtSensorsFreq", "ExtSensorsType", "FairShareDampeningFactor", "FederationParameters",
    "FirstJobId", "GetEnvTimeout", "GpuFreqDef", "GresTypes", "GroupUpdateForce",
    "GroupUpdateTime", "HealthCheckInterval", "HealthCheckNodeState", "HealthCheckProgram",
    "InactiveLimit", "InteractiveStepOptions", "JobAcctGatherFrequency",
    "JobAcctGatherParams", "JobAcctGatherType", "JobCompHost", "JobCompLoc",
    "JobCompParams", "JobCompPass", "JobCompPort", "JobCompType", "JobCompUser",
    "JobContainerType", "JobFileAppend", "JobRequeue", "JobSubmitPlugins", "KillOnBadExit",
    "KillWait", "LaunchParameters", "LaunchType", "Licenses", "LogTimeFormat", "MailDomain",
    "MailProg", "MaxArraySize", "MaxDBDMsgs", "MaxJobCount", "MaxJobId", "MaxMemPerCPU",
    "MaxMemPerNode", "MaxNodeCount", "MaxStepCount", "MaxTasksPerNode", "MCSParameters",
    "MCSPlugin", "MessageTimeout", "MinJobAge", "MpiDefault", "MpiParams",
    "NodeFeaturesPlugins", "OverTimeLimit", "PluginDir", "PlugStackConfig",
    "PowerParameters", "PowerPlugin", "PreemptExemptTime", "PreemptMode", "PreemptType",
    "PrEpParameters", "PrEpPlugins", "PriorityCalcPeriod", "PriorityDecayHalfLife",
    "PriorityFavorSmall", "PriorityFlags", "PriorityMaxAge", "PriorityParameters",
    "PrioritySiteFactorParameters", "PrioritySiteFactorPlugin", "PriorityType",
    "PriorityUsageResetPeriod", "PriorityWeightAge", "PriorityWeightAssoc",
    "PriorityWeightFairshare", "PriorityWeightJobSize", "PriorityWeightPartition",
    "PriorityWeightQOS", "PriorityWeightTRES", "PrivateData", "ProctrackType", "Prolog",
    "PrologEpilogTimeout", "PrologFlags", "PrologSlurmctld", "PropagatePrioProcess",
    "PropagateResourceLimits", "PropagateResourceLimitsExcept", "RebootProgram",
    "ReconfigFlags", "RequeueExit", "RequeueExitHold", "ResumeFailProgram", "ResumeProgram",
    "ResumeRate", "ResumeTimeout", "ResvEpilog", "ResvOverRun", "ResvProlog",
    "ReturnToService", "RoutePlugin", "SchedulerParameters", "SchedulerTimeSlice",
    "SchedulerType", "ScronParameters", "SelectType", "SelectTypeParameters",
    "SlurmctldAddr", "SlurmctldDebug", "SlurmctldHost", "SlurmctldLogFile",
    "SlurmctldParameters", "SlurmctldPidFile", "SlurmctldPlugstack", "SlurmctldPort",
    "SlurmctldPrimaryOffProg", "SlurmctldPrimaryOnProg", "SlurmctldSyslogDebug",
    "SlurmctldTimeout", "SlurmdDebug", "SlurmdLogFile", "SlurmdParameters", "SlurmdPidFile",
    "SlurmdPort", "SlurmdSpoolDir", "SlurmdSyslogDebug", "SlurmdTimeout", "SlurmdUser",
    "SlurmSchedLogFile", "SlurmSchedLogLevel", "SlurmUser", "SrunEpilog", "SrunPortRange",
    "SrunProlog", "StateSaveLocation", "SuspendExcNodes", "SuspendExcParts",
    "SuspendProgram", "SuspendRate", "SuspendTime", "SuspendTimeout", "SwitchParameters",
    "SwitchType", "TaskEpilog", "TaskPlugin", "TaskPluginParam", "TaskProlog", "TCPTimeout",
    "TmpFS", "TopologyParam", "TopologyPlugin", "TrackWCKey", "TreeWidth",
    "UnkillableStepProgram", "UnkillableStepTimeout", "UsePAM", "VSizeFactor", "WaitTime",
    "X11Parameters"
    # Accepted by 22.05 though not in its PARAMETERS section:
    "JobCredentialPrivateKey", "JobCredentialPublicCertificate",
    # Added by releases after 22.05:
    "MaxBatchRequeue", "SuspendExcStates", "HashPlugin", "TLSType", "TLSParameters",
    "CertmgrType", "CertmgrParameters", "DataParserParameters", "PrologTimeout",
    "EpilogTimeout", "NamespaceType", "UrlParserType", "HttpParserType", "MetricsType",
))

GRES_CONF_KEYS: frozenset[str] = frozenset(k.lower() for k in (
    "AutoDetect",
))
"""Top-level gres.conf settings (gres.conf(5)); everything else starts a NodeName/Name line."""

GRES_CONF_PARAMS: frozenset[str] = frozenset(k.lower() for k in (
    "AutoDetect", "Count", "Cores", "CPUs", "File", "Flags", "Links", "MultipleFiles", "Name",
    "NodeName", "Type",
))
"""Parameters of a gres.conf NodeName/Name line (gres.conf(5); CPUs is the old name of Cores)."""
