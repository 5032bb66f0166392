{{- /*
The pod template of the workload: the Deployment's, or with job.schedule the CronJob's
(templates/cronjob.yaml), at column 0 (callers nindent it).
*/ -}}
{{- define "tenure.podTemplate" -}}
{{- $redis := .Values.backend.redis -}}
{{- $isRedis := eq .Values.backend.type "redis" -}}
metadata:
  labels:
    {{- include "tenure.labels" . | nindent 4 }}
    {{- with .Values.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  annotations:
    tenure.dev/lease: {{ include "tenure.lease" . | quote }}
    {{- with .Values.podAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  {{- if .Values.job.schedule }}
  restartPolicy: Never
  {{- end }}
  serviceAccountName: {{ include "tenure.serviceAccountName" . }}
  # Only the Kubernetes backend and the Election status publisher use the API.
  automountServiceAccountToken: {{ include "tenure.needsApi" . | eq "true" }}
  enableServiceLinks: false
  terminationGracePeriodSeconds: {{ include "tenure.terminationGrace" . }}
  {{- with .Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.priorityClassName }}
  priorityClassName: {{ . }}
  {{- end }}
  securityContext:
    {{- toYaml .Values.podSecurityContext | nindent 4 }}
  {{- if .Values.tenure.inject }}
  initContainers:
    # Copies the tenure executable (static, runs in any Linux image) into an emptyDir
    # shared with the workload container.
    - name: tenure-install
      image: {{ include "tenure.imageRef" (list .Values.tenure.image .Chart.AppVersion) | quote }}
      imagePullPolicy: {{ .Values.tenure.image.pullPolicy }}
      command: ["/usr/local/bin/tenure", "install", "/tenure-bin"]
      securityContext:
        {{- toYaml .Values.securityContext | nindent 8 }}
      {{- with .Values.tenure.installResources }}
      resources:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      volumeMounts:
        - name: tenure-bin
          mountPath: /tenure-bin
  {{- end }}
  containers:
    - name: worker
      image: {{ include "tenure.imageRef" (list .Values.image "latest") | quote }}
      imagePullPolicy: {{ .Values.image.pullPolicy }}
      command: [{{ include "tenure.exe" . | quote }}]
      args:
        - "run"
        - {{ printf "--lease=%v" (include "tenure.lease" .) | quote }}
        {{- if $isRedis }}
        - {{ printf "--backend=%v" ($redis.url) | quote }}
        {{- else }}
        - "--backend=kube"
        {{- end }}
        - "--namespace=$(POD_NAMESPACE)"
        - "--identity=$(POD_NAME)"
        - {{ printf "--lease-duration=%v" (.Values.election.leaseDuration) | quote }}
        - {{ printf "--renew-deadline=%v" (.Values.election.renewDeadline) | quote }}
        - {{ printf "--retry-period=%v" (.Values.election.retryPeriod) | quote }}
        - {{ printf "--grace=%v" (.Values.election.grace) | quote }}
        {{- if .Values.election.rejoin }}
        - "--rejoin"
        {{- end }}
        {{- with .Values.job.oncePer }}
        - {{ printf "--once-per=%v" (.) | quote }}
        - {{ printf "--done-exit-code=%v" (int64 $.Values.job.doneExitCode) | quote }}
        {{- end }}
        {{- if .Values.job.try }}
        - "--try"
        {{- end }}
        {{- with .Values.job.timeout }}
        - {{ printf "--timeout=%v" (.) | quote }}
        {{- end }}
        {{- with .Values.sharding.shards }}
        - {{ printf "--shards=%v" (int64 .) | quote }}
        {{- end }}
        {{- with .Values.election.prefer }}
        - {{ printf "--prefer=%v" (.) | quote }}
        {{- end }}
        {{- with .Values.election.health }}
        {{- if .command }}
        - {{ printf "--health-cmd=%v" .command | quote }}
        - {{ printf "--health-interval=%v" .interval | quote }}
        - {{ printf "--unhealthy-after=%v" .unhealthyAfter | quote }}
        - {{ printf "--health-recovery=%v" .recovery | quote }}
        {{- end }}
        {{- end }}
        {{- if include "tenure.fastRestart" . }}
        - "--restart-dir=/run/tenure-restart"
        {{- end }}
        {{- if contains ":" .Values.metrics.host }}
        - {{ printf "--listen=[%v]:%v" (trimPrefix "[" .Values.metrics.host | trimSuffix "]") (.Values.metrics.port) | quote }}
        {{- else }}
        - {{ printf "--listen=%v:%v" (.Values.metrics.host) (.Values.metrics.port) | quote }}
        {{- end }}
        {{- if .Values.election.publishStatus }}
        - "--publish-status"
        - {{ printf "--election=%v" (include "tenure.election" .) | quote }}
        {{- end }}
        {{- if include "tenure.fencingCommand" . }}
        - "--fence"
        {{- end }}
        {{- if $isRedis }}
        {{- with $redis.username }}
        - {{ printf "--redis-username=%v" (.) | quote }}
        {{- end }}
        {{- if or $redis.ca.secretName $redis.ca.configMapName }}
        - {{ printf "--redis-ca-file=/etc/tenure/redis-ca/%v" ($redis.ca.key) | quote }}
        {{- end }}
        {{- with $redis.keyPrefix }}
        - {{ printf "--key-prefix=%v" (.) | quote }}
        {{- end }}
        {{- end }}
        {{- range .Values.tenure.extraArgs }}
        - {{ . | quote }}
        {{- end }}
        - --
        {{- range .Values.command }}
        - {{ . | quote }}
        {{- end }}
        {{- range .Values.args }}
        - {{ . | quote }}
        {{- end }}
      {{- with .Values.workingDir }}
      workingDir: {{ . | quote }}
      {{- end }}
      env:
        - name: POD_NAME
          valueFrom:
            fieldRef:
              fieldPath: metadata.name
        - name: POD_NAMESPACE
          valueFrom:
            fieldRef:
              fieldPath: metadata.namespace
        {{- if and $isRedis $redis.passwordSecret.name }}
        - name: TENURE_REDIS_PASSWORD
          valueFrom:
            secretKeyRef:
              name: {{ $redis.passwordSecret.name }}
              key: {{ $redis.passwordSecret.key }}
        {{- end }}
        {{- with .Values.env }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- with .Values.envFrom }}
      envFrom:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      ports:
        - name: metrics
          containerPort: {{ .Values.metrics.port }}
          protocol: TCP
      livenessProbe:
        httpGet:
          path: /healthz
          port: metrics
        {{- toYaml .Values.livenessProbe | nindent 8 }}
      readinessProbe:
        httpGet:
          path: /readyz
          port: metrics
        {{- toYaml .Values.readinessProbe | nindent 8 }}
      {{- with .Values.resources }}
      resources:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      securityContext:
        {{- toYaml .Values.securityContext | nindent 8 }}
      volumeMounts:
        {{- if .Values.tenure.inject }}
        - name: tenure-bin
          mountPath: /tenure-bin
          readOnly: true
        {{- end }}
        {{- if .Values.tmpVolume.enabled }}
        - name: tmp
          mountPath: /tmp
        {{- end }}
        {{- if include "tenure.fastRestart" . }}
        - name: tenure-restart
          mountPath: /run/tenure-restart
        {{- end }}
        {{- if and $isRedis (or $redis.ca.secretName $redis.ca.configMapName) }}
        - name: redis-ca
          mountPath: /etc/tenure/redis-ca
          readOnly: true
        {{- end }}
        {{- with .Values.extraVolumeMounts }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
  volumes:
    {{- if .Values.tenure.inject }}
    - name: tenure-bin
      emptyDir:
        sizeLimit: 64Mi
    {{- end }}
    {{- if .Values.tmpVolume.enabled }}
    - name: tmp
      emptyDir:
        sizeLimit: {{ .Values.tmpVolume.sizeLimit }}
    {{- end }}
    {{- if include "tenure.fastRestart" . }}
    # Outlives container restarts, not the pod: the restart lock and its record.
    - name: tenure-restart
      emptyDir:
        sizeLimit: 1Mi
    {{- end }}
    {{- if and $isRedis $redis.ca.secretName }}
    - name: redis-ca
      secret:
        secretName: {{ $redis.ca.secretName }}
        items:
          - key: {{ $redis.ca.key }}
            path: {{ $redis.ca.key }}
    {{- else if and $isRedis $redis.ca.configMapName }}
    - name: redis-ca
      configMap:
        name: {{ $redis.ca.configMapName }}
        items:
          - key: {{ $redis.ca.key }}
            path: {{ $redis.ca.key }}
    {{- end }}
    {{- with .Values.extraVolumes }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with .Values.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.topologySpreadConstraints }}
  topologySpreadConstraints:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}
