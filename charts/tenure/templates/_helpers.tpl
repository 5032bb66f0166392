{{/* The chart's name. */}}
{{- define "tenure.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release's full name (object names). */}}
{{- define "tenure.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "tenure.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Quoted: a release named off, yes or no would otherwise be a YAML boolean. */}}
{{- define "tenure.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tenure.name" . | quote }}
app.kubernetes.io/instance: {{ .Release.Name | quote }}
{{- end -}}

{{- define "tenure.labels" -}}
helm.sh/chart: {{ include "tenure.chart" . }}
{{ include "tenure.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "tenure.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "tenure.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The lease's name. */}}
{{- define "tenure.lease" -}}
{{- default (include "tenure.fullname" .) .Values.election.lease -}}
{{- end -}}

{{/* The Election custom resource's name. */}}
{{- define "tenure.election" -}}
{{- default (include "tenure.lease" .) .Values.election.name -}}
{{- end -}}

{{/* Whether the pods talk to the Kubernetes API at all (tenure, or the workload by rbac.extraRules). */}}
{{- define "tenure.needsApi" -}}
{{- if or (eq .Values.backend.type "kube") .Values.election.publishStatus .Values.rbac.extraRules -}}true{{- end -}}
{{- end -}}

{{/*
The name of the fencing policy, of its binding and of the fencing ClusterRole and
ClusterRoleBinding (all cluster-scoped): tenure-fencing.<namespace>.<lease>, as
tenure::fence::kube::FencingPolicy::name() spells it.
*/}}
{{- define "tenure.fencingName" -}}
{{- printf "tenure-fencing.%s.%s" .Release.Namespace (include "tenure.lease" .) -}}
{{- end -}}

{{/*
The name of the fencing anchor's policy and binding (templates/fencing-anchor.yaml):
tenure-fencing-anchor, one per cluster, as tenure::fence::kube::ANCHOR_NAME (what `tenure
policy` prints), so that the chart and `tenure policy` install one and the same anchor.
*/}}
{{- define "tenure.fencingAnchorName" -}}
tenure-fencing-anchor
{{- end -}}

{{/*
Whether this release renders the anchor's object of kind (index . 1), "true" or "":
fencing.policy.anchor true always, false never; auto when the cluster has no such object, or
when this release manages it already (Helm's ownership annotations name this release and
namespace). So the first fenced release of a cluster installs the one anchor, keeps it in its
manifest on every upgrade, and every other release leaves it to its owner: Helm refuses to
install an object another release owns. `helm template` and a client-side dry run see no
cluster: they render it.
*/}}
{{- define "tenure.fencingAnchorRendered" -}}
{{- $ctx := index . 0 -}}
{{- $mode := $ctx.Values.fencing.policy.anchor -}}
{{- if kindIs "bool" $mode -}}
{{- if $mode -}}true{{- end -}}
{{- else -}}
{{- include "tenure.absentOrOwned" (list $ctx "admissionregistration.k8s.io/v1" (index . 1) "" (include "tenure.fencingAnchorName" $ctx)) -}}
{{- end -}}
{{- end -}}

{{/*
"true" when the object (list ctx apiVersion kind namespace name) does not exist, or when this
release manages it (Helm's ownership annotations name this release and namespace); "" when
something else made it (`tenure policy | kubectl apply`, another release), which Helm would
refuse to take over. `helm template` and a client-side dry run see no cluster: "true".
*/}}
{{- define "tenure.absentOrOwned" -}}
{{- $ctx := index . 0 -}}
{{- $found := lookup (index . 1) (index . 2) (index . 3) (index . 4) -}}
{{- if not $found -}}
true
{{- else -}}
{{- $owner := dig "metadata" "annotations" dict $found -}}
{{- if and (eq (get $owner "meta.helm.sh/release-name") $ctx.Release.Name) (eq (get $owner "meta.helm.sh/release-namespace") $ctx.Release.Namespace) -}}
true
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
The anchor's annotations: the generator's tenure.dev/why, and helm.sh/resource-policy: keep so
that neither `helm uninstall` nor an upgrade that turns fencing off deletes it.
*/}}
{{- define "tenure.fencingAnchorAnnotations" -}}
helm.sh/resource-policy: keep
tenure.dev/why: "keeps the API server's Lease parameter informer running (kubernetes/kubernetes#130887); never delete it"
{{- end -}}

{{/*
Labels of the fencing objects: the chart's, and the election's as FencingPolicy::metadata sets
them (app.kubernetes.io/managed-by stays Helm's: Helm manages these objects).
*/}}
{{- define "tenure.fencingLabels" -}}
{{ include "tenure.labels" . }}
tenure.dev/lease: {{ include "tenure.lease" . | quote }}
tenure.dev/lease-namespace: {{ .Release.Namespace | quote }}
{{- end -}}

{{/*
The election's participants (JSON list), as FencingPolicy::push_user collects them: the chart's
ServiceAccount, then fencing.policy.extraServiceAccounts, then fencing.policy.extraUsers, each
once.
*/}}
{{- define "tenure.fencingParticipants" -}}
{{- $ns := .Release.Namespace -}}
{{- $p := .Values.fencing.policy -}}
{{- $users := list (printf "system:serviceaccount:%s:%s" $ns (include "tenure.serviceAccountName" .)) -}}
{{- range $p.extraServiceAccounts -}}
{{- $u := printf "system:serviceaccount:%s:%s" (default $ns .namespace) .name -}}
{{- if not (has $u $users) }}{{ $users = append $users $u }}{{ end -}}
{{- end -}}
{{- range $p.extraUsers -}}
{{- if not (has . $users) }}{{ $users = append $users . }}{{ end -}}
{{- end -}}
{{- toJson $users -}}
{{- end -}}

{{/*
The participants that are ServiceAccounts (JSON object: namespace -> names, in participant
order), as FencingPolicy::worker_rbac reads them: every participant named
system:serviceaccount:NS:NAME, an extraUsers entry of that form too.
*/}}
{{- define "tenure.fencingServiceAccounts" -}}
{{- $byNs := dict -}}
{{- range include "tenure.fencingParticipants" . | fromJsonArray -}}
{{- if hasPrefix "system:serviceaccount:" . -}}
{{- $rest := trimPrefix "system:serviceaccount:" . -}}
{{- if contains ":" $rest -}}
{{- $sa := splitn ":" 2 $rest -}}
{{- $_ := set $byNs $sa._0 (append (default (list) (get $byNs $sa._0)) $sa._1) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toJson $byNs -}}
{{- end -}}

{{/*
The subjects of the election's RoleBinding and ClusterRoleBinding (JSON list): every
participant ServiceAccount, by namespace in alphabetical order, as FencingPolicy::worker_rbac.
*/}}
{{- define "tenure.fencingSubjects" -}}
{{- $byNs := include "tenure.fencingServiceAccounts" . | fromJson -}}
{{- $subjects := list -}}
{{- range $ns := keys $byNs | sortAlpha -}}
{{- range get $byNs $ns -}}
{{- $subjects = append $subjects (dict "kind" "ServiceAccount" "name" . "namespace" $ns) -}}
{{- end -}}
{{- end -}}
{{- toJson $subjects -}}
{{- end -}}

{{/*
The name of the election's worker Role and RoleBinding (the Lease, Events, impersonating the
participants of the release's namespace), as FencingPolicy::worker_rbac names them.
*/}}
{{- define "tenure.workerRoleName" -}}
{{- printf "tenure-worker.%s" (include "tenure.lease" .) -}}
{{- end -}}

{{/*
Whether the chart grants the impersonation a fenced client needs to carry its token:
fencing.impersonation, or when it is null, fencing.policy.enabled; never without rbac.create.
*/}}
{{- define "tenure.fencingImpersonation" -}}
{{- $f := .Values.fencing -}}
{{- $on := ternary $f.policy.enabled $f.impersonation (kindIs "invalid" $f.impersonation) -}}
{{- if and .Values.rbac.create $on -}}true{{- end -}}
{{- end -}}

{{/*
Whether the command's Kubernetes writes are fenced (`tenure run --fence`): fencing.command, or
when it is null, fencing.policy.enabled with the Kubernetes backend, unless
fencing.impersonation is false (RBAC granted outside the chart: the release then renders as it
did before fencing.command existed).
*/}}
{{- define "tenure.fencingCommand" -}}
{{- $f := .Values.fencing -}}
{{- if kindIs "invalid" $f.command -}}
{{- $noImpersonation := and (kindIs "bool" $f.impersonation) (not $f.impersonation) -}}
{{- if and $f.policy.enabled (eq .Values.backend.type "kube") (not $noImpersonation) -}}true{{- end -}}
{{- else if $f.command -}}true{{- end -}}
{{- end -}}

{{/*
image, imagePullPolicy and command of a hook's container that runs tenure alone (the uninstall
hook's `tenure drain`, the test's `tenure status`): the tenure image when it is injected, else
the workload image, which then has tenure at tenure.path. At column 0 (callers nindent it).
*/}}
{{- define "tenure.cliContainer" -}}
{{- if .Values.tenure.inject -}}
image: {{ include "tenure.imageRef" (list .Values.tenure.image .Chart.AppVersion) | quote }}
imagePullPolicy: {{ .Values.tenure.image.pullPolicy }}
command: ["/usr/local/bin/tenure"]
{{- else -}}
image: {{ include "tenure.imageRef" (list .Values.image "latest") | quote }}
imagePullPolicy: {{ .Values.image.pullPolicy }}
command: [{{ .Values.tenure.path | quote }}]
{{- end -}}
{{- end -}}

{{/* An image reference from {repository, tag, digest} and a default tag. */}}
{{- define "tenure.imageRef" -}}
{{- $img := index . 0 -}}
{{- $defaultTag := index . 1 -}}
{{- if $img.digest -}}
{{- printf "%s@%s" $img.repository $img.digest -}}
{{- else -}}
{{- printf "%s:%s" $img.repository (toString (default $defaultTag $img.tag)) -}}
{{- end -}}
{{- end -}}

{{/*
A duration in nanoseconds, called with (list NAME VALUE); NAME is for the error messages.
VALUE is read as `tenure run` reads it: Go's syntax, the grammar of values.schema.json
(500ms, 15s, 1m30s, 1h2m3.5s, 0). Its components are summed in whole nanoseconds: digits go
through atoi, which reads them as decimal (sprig's int64 would read 015 as octal), and a
fraction is padded or cut to 9 digits. At most 365 days (tenure refuses longer), which keeps
the sums and products of the checks far from int64's limit.
*/}}
{{- define "tenure.durationNs" -}}
{{- $name := index . 0 -}}
{{- $d := index . 1 | toString -}}
{{- if not (regexMatch "^(0|([0-9]+(\\.[0-9]+)?(ns|us|µs|μs|ms|s|m|h))+)$" $d) -}}
{{- fail (printf "%s (%s) is not a duration like 500ms, 15s or 1m30s" $name $d) -}}
{{- end -}}
{{- $units := dict "ns" 1 "us" 1000 "µs" 1000 "μs" 1000 "ms" 1000000 "s" 1000000000 "m" 60000000000 "h" 3600000000000 -}}
{{- $max := 31536000000000000 -}}
{{- $total := 0 -}}
{{- range regexFindAll "[0-9]+(\\.[0-9]+)?(ns|us|µs|μs|ms|s|m|h)" $d -1 -}}
{{- $unit := regexFind "(ns|us|µs|μs|ms|s|m|h)$" . -}}
{{- $scale := get $units $unit -}}
{{- $number := splitList "." (trimSuffix $unit .) -}}
{{- $whole := regexReplaceAll "^0+" (first $number) "" -}}
{{- if or (gt (len $whole) 18) (gt (atoi (default "0" $whole)) (div $max $scale)) -}}
{{- fail (printf "%s (%s) is longer than 365 days, the longest duration tenure takes" $name $d) -}}
{{- end -}}
{{- $total = add $total (mul (atoi (default "0" $whole)) $scale) -}}
{{- if gt (len $number) 1 -}}
{{- $nanos := printf "%s000000000" (last $number) | trunc 9 | atoi -}}
{{- if ge $scale 1000000000 -}}
{{- $total = add $total (mul $nanos (div $scale 1000000000)) -}}
{{- else -}}
{{- $total = add $total (div (mul $nanos $scale) 1000000000) -}}
{{- end -}}
{{- end -}}
{{- if gt $total $max -}}
{{- fail (printf "%s (%s) is longer than 365 days, the longest duration tenure takes" $name $d) -}}
{{- end -}}
{{- end -}}
{{- $total -}}
{{- end -}}

{{/*
Cross-field rules the schema cannot express, checked at template/install time with a clear
message. Renders nothing. The duration rules are `tenure run`'s (src/bin/tenure/run/setup.rs,
`duration_rule`), in the same order and words, with election.* for the flags: helm refuses
what the pod would refuse with exit 2 (a CrashLoopBackOff).
*/}}
{{- define "tenure.validate" -}}
{{- $e := .Values.election -}}
{{- $lease := include "tenure.durationNs" (list "election.leaseDuration" $e.leaseDuration) | int64 -}}
{{- $deadline := include "tenure.durationNs" (list "election.renewDeadline" $e.renewDeadline) | int64 -}}
{{- $retry := include "tenure.durationNs" (list "election.retryPeriod" $e.retryPeriod) | int64 -}}
{{- if lt $lease 30000000 -}}
{{- fail (printf "election.leaseDuration (%s) must be at least 30ms" $e.leaseDuration) -}}
{{- end -}}
{{- if le $retry 0 -}}
{{- fail (printf "election.retryPeriod (%s) must be positive" $e.retryPeriod) -}}
{{- end -}}
{{- if le $lease $deadline -}}
{{- fail (printf "election.renewDeadline (%s) must be shorter than election.leaseDuration (%s)" $e.renewDeadline $e.leaseDuration) -}}
{{- end -}}
{{- if le (mul $deadline 5) (mul $retry 6) -}}
{{- fail (printf "election.renewDeadline (%s) must be longer than 1.2 × election.retryPeriod (%s)" $e.renewDeadline $e.retryPeriod) -}}
{{- end -}}
{{- if le (mul $deadline 3) $lease -}}
{{- fail (printf "election.renewDeadline (%s) must be longer than a third of election.leaseDuration (%s): the leader first renews a third of the way into the lease, so a renew deadline no longer than that ends every term before its first renewal; set election.renewDeadline to about two thirds of the lease (%dms for %s)" $e.renewDeadline $e.leaseDuration (div (mul $lease 2) 3000000) $e.leaseDuration) -}}
{{- end -}}
{{- $valid := sub $lease (add (div $lease 100) 2000000) -}}
{{- if gt $deadline $valid -}}
{{- fail (printf "election.renewDeadline (%s) must be at most election.leaseDuration (%s) minus its clock-drift allowance (1%% + 2ms): at most %dms here" $e.renewDeadline $e.leaseDuration (div $valid 1000000)) -}}
{{- end -}}
{{- $grace := include "tenure.durationNs" (list "election.grace" $e.grace) | int64 -}}
{{- /* Whole seconds: T > grace + 2 s exactly when T > floor((grace + 2 s) / 1 s). */ -}}
{{- if and (not (kindIs "invalid" .Values.terminationGracePeriodSeconds)) (le (int64 .Values.terminationGracePeriodSeconds) (div (add $grace 2000000000) 1000000000)) -}}
{{- fail (printf "terminationGracePeriodSeconds (%v) must be longer than election.grace (%s) + 2s: tenure needs the grace period and then time to release the lease" .Values.terminationGracePeriodSeconds $e.grace) -}}
{{- end -}}
{{- if and .Values.job.oncePer (not .Values.job.schedule) -}}
{{- fail "job.oncePer needs job.schedule: a Deployment restarts its container after every exit, so a finished run-once job would be started again and again; set job.schedule (a CronJob) or run tenure run --once-per yourself" -}}
{{- end -}}
{{- if and .Values.job.schedule .Values.sharding.shards -}}
{{- fail "job.schedule (a CronJob) cannot run sharded workers (sharding.shards): unset one of them" -}}
{{- end -}}
{{- if and .Values.job.schedule (not .Values.job.oncePer) -}}
{{- fail "job.schedule needs job.oncePer: without it every Job the CronJob starts runs the command, with the lease only keeping two of them from running at once; set job.oncePer (e.g. 24h for a daily schedule)" -}}
{{- end -}}
{{- if and (eq .Values.backend.type "redis") .Values.backend.redis.ca.secretName .Values.backend.redis.ca.configMapName -}}
{{- fail "backend.redis.ca: set secretName or configMapName, not both" -}}
{{- end -}}
{{- if and (eq .Values.backend.type "redis") (or .Values.backend.redis.ca.secretName .Values.backend.redis.ca.configMapName) (not (hasPrefix "rediss://" .Values.backend.redis.url)) -}}
{{- fail "backend.redis.ca is set but backend.redis.url is not rediss:// (TLS)" -}}
{{- end -}}
{{- if and (not .Values.tenure.inject) (hasPrefix "/tenure-bin/" .Values.tenure.path) -}}
{{- fail "tenure.path points into /tenure-bin, which only exists with tenure.inject: true" -}}
{{- end -}}
{{- $f := .Values.fencing -}}
{{- $impersonation := ternary $f.policy.enabled $f.impersonation (kindIs "invalid" $f.impersonation) -}}
{{- if .Values.sharding.shards -}}
{{- $lease := include "tenure.lease" . -}}
{{- if and $f.policy.enabled (gt (len $lease) 63) -}}
{{- fail (printf "with sharding.shards and fencing.policy the lease name may have at most 63 characters (the group's policy selects its shard Leases by the label tenure.dev/shard-group=<lease>, and a label value has at most 63); %q has %d" $lease (len $lease)) -}}
{{- end -}}
{{- if gt (len $lease) 229 -}}
{{- fail (printf "with sharding.shards the lease name may have at most 229 characters (its member Leases are named <lease>-member-<16 hex digits>, at most 253); %q has %d" $lease (len $lease)) -}}
{{- end -}}
{{- end -}}
{{- range $value, $on := dict "election.prefer" .Values.election.prefer "election.health.command" (dig "health" "command" "" .Values.election) -}}
{{- if $on -}}
{{- if $.Values.sharding.shards -}}
{{- fail (printf "%s does not apply with sharding.shards: a shard's lease follows the group's assignment" $value) -}}
{{- end -}}
{{- $lease := include "tenure.lease" $ -}}
{{- if and (eq $.Values.backend.type "kube") (gt (len $lease) 221) -}}
{{- fail (printf "with %s the lease name may have at most 221 characters (its member Leases are named <lease>-healthy-member-<16 hex digits>, at most 253); %q has %d" $value $lease (len $lease)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if and (or $f.policy.enabled $impersonation) (ne .Values.backend.type "kube") -}}
{{- fail "fencing.policy / fencing.impersonation need backend.type kube: the policy reads the election's Lease" -}}
{{- end -}}
{{- if include "tenure.fencingCommand" . -}}
{{- if ne .Values.backend.type "kube" -}}
{{- fail (printf "fencing.command needs backend.type=kube (it is %s): the command's writes carry the token of the term of a Lease, which the API server's policy reads" .Values.backend.type) -}}
{{- end -}}
{{- $ownTmp := false -}}
{{- range .Values.extraVolumeMounts -}}
{{- if eq (trimSuffix "/" (toString .mountPath)) "/tmp" -}}{{- $ownTmp = true -}}{{- end -}}
{{- end -}}
{{- if and (not .Values.tmpVolume.enabled) (not $ownTmp) .Values.securityContext.readOnlyRootFilesystem -}}
{{- fail "fencing.command needs tmpVolume.enabled=true: tenure writes each term's fenced kubeconfig under /tmp ($TMPDIR), and the root filesystem is read-only (securityContext.readOnlyRootFilesystem)" -}}
{{- end -}}
{{- end -}}
{{- if $f.policy.enabled -}}
{{- if not (semverCompare ">=1.30.0-0" .Capabilities.KubeVersion.Version) -}}
{{- fail (printf "fencing.policy.enabled needs Kubernetes >= 1.30 (admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy); the cluster is %s" .Capabilities.KubeVersion.Version) -}}
{{- end -}}
{{- $lease := include "tenure.lease" . -}}
{{- if gt (len $lease) 63 -}}
{{- fail (printf "fencing.policy.enabled needs a lease name of at most 63 characters (it labels the policy, tenure.dev/lease); %q has %d" $lease (len $lease)) -}}
{{- end -}}
{{- $name := include "tenure.fencingName" . -}}
{{- if gt (len $name) 253 -}}
{{- fail (printf "the fencing policy's name %q would be longer than 253 characters" $name) -}}
{{- end -}}
{{- /* What the election itself writes without a token (FencingPolicy::resource refuses them too). */ -}}
{{- $own := list "leases.coordination.k8s.io" "events" "events.events.k8s.io" "elections.tenure.dev" -}}
{{- range $f.policy.resources -}}
{{- $resource := regexReplaceAll "\\..*$" . "" -}}
{{- if gt (len $resource) 63 -}}
{{- fail (printf "fencing.policy.resources: %q: the resource part must be at most 63 characters" .) -}}
{{- end -}}
{{- if has . $own -}}
{{- fail (printf "fencing.policy.resources: %q cannot be governed: the election itself writes it without a token (its Lease, Events or Election status), so governing it would keep every replica from leading or refuse the election's own writes; tenure policy refuses it too" .) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* terminationGracePeriodSeconds: the value given, else grace (rounded up) + 10 s. */}}
{{- define "tenure.terminationGrace" -}}
{{- if kindIs "invalid" .Values.terminationGracePeriodSeconds -}}
{{- $grace := include "tenure.durationNs" (list "election.grace" .Values.election.grace) | int64 -}}
{{- add (div (add $grace 999999999) 1000000000) 10 -}}
{{- else -}}
{{- .Values.terminationGracePeriodSeconds -}}
{{- end -}}
{{- end -}}

{{/* The tenure executable in the workload container. */}}
{{- define "tenure.exe" -}}
{{- if .Values.tenure.inject -}}/tenure-bin/tenure{{- else -}}{{ .Values.tenure.path }}{{- end -}}
{{- end -}}

{{/*
"true" when the worker runs with --restart-dir (election.fastRestart), else "".
*/}}
{{- define "tenure.fastRestart" -}}
{{- if .Values.election.fastRestart -}}true{{- end -}}
{{- end -}}
