{{/* Names and labels ------------------------------------------------------------------------- */}}
{{- define "fragscope.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "fragscope.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "fragscope.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "fragscope.instanceLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "fragscope.instanceLabels" -}}
app.kubernetes.io/name: {{ include "fragscope.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The pods the Service and the PodMonitor select: this chart's, or the existing engine's (inject). */}}
{{- define "fragscope.podSelectorLabels" -}}
{{- if .Values.engine.enabled }}
{{- include "fragscope.instanceLabels" . }}
{{- else if .Values.inject.podLabels }}
{{- toYaml .Values.inject.podLabels }}
{{- else }}
{{- fail "engine.enabled=false (inject mode) needs inject.podLabels: the labels of the existing engine pods" }}
{{- end }}
{{- end }}

{{/* Engine defaults by kind ---------------------------------------------------------------- */}}
{{- define "fragscope.engineKind" -}}
{{- $k := .Values.engine.kind | default "vllm" }}
{{- if not (has $k (list "vllm" "sglang")) }}
{{- fail (printf "engine.kind must be vllm or sglang, not %q" $k) }}
{{- end }}
{{- $k }}
{{- end }}

{{- define "fragscope.enginePort" -}}
{{- if .Values.engine.port }}{{ .Values.engine.port }}{{ else if eq (include "fragscope.engineKind" .) "sglang" }}30000{{ else }}8000{{ end }}
{{- end }}

{{- define "fragscope.engineContainerName" -}}
{{- .Values.engine.containerName | default (include "fragscope.engineKind" .) }}
{{- end }}

{{- define "fragscope.engineImage" -}}
{{- $repo := .Values.engine.image.repository }}
{{- if not $repo }}{{ $repo = ternary "lmsysorg/sglang" "vllm/vllm-openai" (eq (include "fragscope.engineKind" .) "sglang") }}{{ end }}
{{- printf "%s:%s" $repo (.Values.engine.image.tag | default "latest") }}
{{- end }}

{{/* Engine log to a file only where the engine offers a logging-config hook (vLLM). */}}
{{- define "fragscope.engineLogFile" -}}
{{- if and .Values.engine.logFile.enabled (eq (include "fragscope.engineKind" .) "vllm") }}true{{ end }}
{{- end }}

{{/* Paths inside the pod (shared emptyDirs). */}}
{{- define "fragscope.probeLibDir" -}}/opt/fragscope-probe{{- end }}
{{- define "fragscope.probeDir" -}}/run/fragscope-probe{{- end }}
{{- define "fragscope.engineLogDir" -}}/var/log/engine{{- end }}
{{- define "fragscope.dataDir" -}}/var/lib/fragscope{{- end }}

{{/* The agent container ------------------------------------------------------------------- */}}
{{- define "fragscope.agentArgs" -}}
- --listen={{ .Values.agent.listenHost }}:{{ .Values.agent.port }}
- --data-dir={{ include "fragscope.dataDir" . }}
- --vllm=http://127.0.0.1:{{ include "fragscope.enginePort" . }}{{ .Values.engine.metricsPath }}
{{- if .Values.probe.enabled }}
- --probe-dir={{ include "fragscope.probeDir" . }}
{{- end }}
{{- if include "fragscope.engineLogFile" . }}
- --log-file={{ include "fragscope.engineLogDir" . }}/engine.log
{{- end }}
- --interval={{ .Values.agent.interval }}
- --detect-interval={{ .Values.agent.detectInterval }}
- --retention={{ .Values.agent.retention }}
- --max-store-size={{ .Values.agent.maxStoreSize }}
{{- if not .Values.agent.nvidiaVisibleDevices }}
- --no-nvml
{{- end }}
{{- if .Values.agent.dcgmUrl }}
- --dcgm={{ .Values.agent.dcgmUrl }}
{{- end }}
{{- if not .Values.agent.processCollector }}
- --no-process
{{- end }}
{{- range .Values.agent.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end }}

{{- define "fragscope.agentImage" -}}
{{- printf "%s:%s" .Values.agent.image.repository (.Values.agent.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{- define "fragscope.restrictedSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
readOnlyRootFilesystem: true
allowPrivilegeEscalation: false
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{- define "fragscope.agentContainer" -}}
- name: fragscope
  image: {{ include "fragscope.agentImage" . }}
  imagePullPolicy: {{ .Values.agent.image.pullPolicy }}
  args:
    {{- include "fragscope.agentArgs" . | trim | nindent 4 }}
  {{- if or .Values.agent.nvidiaVisibleDevices .Values.agent.env }}
  env:
    {{- if .Values.agent.nvidiaVisibleDevices }}
    - name: NVIDIA_VISIBLE_DEVICES
      value: {{ .Values.agent.nvidiaVisibleDevices | quote }}
    - name: NVIDIA_DRIVER_CAPABILITIES
      value: utility
    {{- end }}
    {{- with .Values.agent.env }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- end }}
  ports:
    - name: fragscope
      containerPort: {{ .Values.agent.port }}
      protocol: TCP
  readinessProbe:
    httpGet: {path: {{ .Values.agent.readinessPath }}, port: fragscope}
    {{- toYaml .Values.agent.readinessProbe | nindent 4 }}
  livenessProbe:
    httpGet: {path: /healthz, port: fragscope}
    {{- toYaml .Values.agent.livenessProbe | nindent 4 }}
  resources:
    {{- toYaml .Values.agent.resources | nindent 4 }}
  securityContext:
    {{- include "fragscope.restrictedSecurityContext" . | trim | nindent 4 }}
  volumeMounts:
    - name: fragscope-history
      mountPath: {{ include "fragscope.dataDir" . }}
    {{- if .Values.probe.enabled }}
    - name: fragscope-probe
      mountPath: {{ include "fragscope.probeDir" . }}
    {{- end }}
    {{- if include "fragscope.engineLogFile" . }}
    - name: engine-log
      mountPath: {{ include "fragscope.engineLogDir" . }}
      readOnly: true
    {{- end }}
    - name: fragscope-tmp
      mountPath: /tmp
{{- end }}

{{/* The init container that delivers the probe (standard library only) to the engine. */}}
{{- define "fragscope.probeInitContainer" -}}
- name: fragscope-probe-install
  image: {{ include "fragscope.agentImage" . }}
  imagePullPolicy: {{ .Values.agent.image.pullPolicy }}
  command: ["fragscope-install-probe", "{{ include "fragscope.probeLibDir" . }}"]
  resources:
    requests: {cpu: 10m, memory: 32Mi}
    limits: {cpu: 200m, memory: 64Mi}
  securityContext:
    {{- include "fragscope.restrictedSecurityContext" . | trim | nindent 4 }}
  volumeMounts:
    - name: fragscope-probe-lib
      mountPath: {{ include "fragscope.probeLibDir" . }}
{{- end }}

{{/* What the engine container gets: the probe's environment, the logging config, the mounts. */}}
{{- define "fragscope.engineEnv" -}}
{{- if .Values.probe.enabled }}
- name: PYTHONPATH
  value: {{ include "fragscope.probeLibDir" . }}/boot
- name: FRAGSCOPE_PROBE
  value: "1"
- name: FRAGSCOPE_PROBE_DIR
  value: {{ include "fragscope.probeDir" . }}
- name: FRAGSCOPE_PROBE_INTERVAL
  value: {{ .Values.probe.interval | quote }}
{{- end }}
{{- if include "fragscope.engineLogFile" . }}
- name: VLLM_CONFIGURE_LOGGING
  value: "1"
- name: VLLM_LOGGING_CONFIG_PATH
  value: /etc/fragscope-engine/logging.json
{{- end }}
{{- end }}

{{- define "fragscope.engineVolumeMounts" -}}
{{- if .Values.probe.enabled }}
- name: fragscope-probe-lib
  mountPath: {{ include "fragscope.probeLibDir" . }}
  readOnly: true
- name: fragscope-probe
  mountPath: {{ include "fragscope.probeDir" . }}
{{- end }}
{{- if include "fragscope.engineLogFile" . }}
- name: engine-log
  mountPath: {{ include "fragscope.engineLogDir" . }}
- name: engine-logging-config
  mountPath: /etc/fragscope-engine
  readOnly: true
{{- end }}
{{- end }}

{{/* The pod's shared volumes. */}}
{{- define "fragscope.volumes" -}}
- name: fragscope-history
  emptyDir:
    sizeLimit: {{ .Values.agent.historySizeLimit }}
- name: fragscope-tmp
  emptyDir:
    sizeLimit: 64Mi
{{- if .Values.probe.enabled }}
- name: fragscope-probe-lib
  emptyDir:
    sizeLimit: 8Mi
- name: fragscope-probe
  emptyDir:
    medium: Memory
    sizeLimit: 64Mi
{{- end }}
{{- if include "fragscope.engineLogFile" . }}
- name: engine-log
  emptyDir:
    sizeLimit: {{ .Values.engine.logFile.sizeLimit }}
- name: engine-logging-config
  configMap:
    name: {{ include "fragscope.fullname" . }}-engine-logging
{{- end }}
{{- end }}

{{/* The engine container (stock image; the kind's command exec'd directly, no shell). */}}
{{- define "fragscope.engineContainer" -}}
{{- $kind := include "fragscope.engineKind" . }}
{{- $port := include "fragscope.enginePort" . }}
- name: {{ include "fragscope.engineContainerName" . }}
  image: {{ include "fragscope.engineImage" . }}
  imagePullPolicy: {{ .Values.engine.image.pullPolicy }}
  {{- if .Values.engine.command }}
  command:
    {{- toYaml .Values.engine.command | nindent 4 }}
  {{- else if eq $kind "sglang" }}
  command: ["python3", "-m", "sglang.launch_server"]
  {{- else }}
  command: ["vllm", "serve"]
  {{- end }}
  args:
    {{- if eq $kind "sglang" }}
    - --model-path
    - {{ .Values.engine.model | quote }}
    - --host
    - 0.0.0.0
    - --port
    - {{ $port | quote }}
    - --enable-metrics
    {{- else }}
    - {{ .Values.engine.model | quote }}
    - --host
    - 0.0.0.0
    - --port
    - {{ $port | quote }}
    {{- end }}
    {{- range .Values.engine.extraArgs }}
    - {{ . | quote }}
    {{- end }}
  env:
    {{- include "fragscope.engineEnv" . | trim | nindent 4 }}
    {{- with .Values.engine.env }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  ports:
    - name: {{ .Values.engine.portName }}
      containerPort: {{ $port }}
      protocol: TCP
  {{- with .Values.engine.readinessProbe }}
  readinessProbe:
    {{- $p := deepCopy . }}
    {{- if $p.httpGet }}{{ $_ := set $p.httpGet "port" $.Values.engine.portName }}{{ end }}
    {{- toYaml $p | nindent 4 }}
  {{- end }}
  {{- with .Values.engine.startupProbe }}
  startupProbe:
    {{- $p := deepCopy . }}
    {{- if $p.httpGet }}{{ $_ := set $p.httpGet "port" $.Values.engine.portName }}{{ end }}
    {{- toYaml $p | nindent 4 }}
  {{- end }}
  resources:
    {{- toYaml .Values.engine.resources | nindent 4 }}
  volumeMounts:
    {{- include "fragscope.engineVolumeMounts" . | trim | nindent 4 }}
    - name: dshm
      mountPath: /dev/shm
{{- end }}
